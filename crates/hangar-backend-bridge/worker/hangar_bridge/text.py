"""Text helpers shared by the adapters (standard library only at import time).

- `IncrementalDecoder`: token ids in, text out, never a partial UTF-8 character.
- `StopFilter`: the worker's stop sequences, holding back text that could still become one.
- `read_json`, `thinking_kwargs`, `render_chat_template`: a model directory's tokenizer
  files and its Hugging Face chat template (rendered with jinja2, imported lazily).
"""

import json
import os

from . import BridgeError, missing_package

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Decodes a growing token sequence into text deltas.

    `decode(ids) -> str` decodes a list of ids (for byte-level tokenizers an incomplete
    UTF-8 sequence decodes to U+FFFD). Each `push` re-decodes a short window (the tokens
    of the previous delta plus the new ones) so tokenizers that depend on context (leading
    spaces of SentencePiece pieces) stay right, and it emits nothing while the window's
    text ends in U+FFFD: the next token may complete the character.
    """

    def __init__(self, decode):
        self._decode = decode
        self._ids = []
        self._prefix = 0  # start of the window
        self._read = 0  # end of the text already emitted

    def push(self, token_id):
        """Adds one token; returns the new text (possibly empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self):
        """The text still held at the end (a trailing U+FFFD is dropped)."""
        return self._advance(final=True)

    def _advance(self, final):
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if final:
            text = text.rstrip(REPLACEMENT)
        elif text.endswith(REPLACEMENT):
            return ""
        if len(text) <= len(before):
            return ""  # nothing new yet (e.g. a special token decoded to "")
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before) :]


class StopFilter:
    """Applies stop sequences to streamed text.

    `push(text)` returns `(emit, stopped)`: the text that can be sent now, and whether a stop
    sequence was found (then `emit` is the text before it and the generation must end, and
    `met` is that sequence's index in the request's list). A tail that is the beginning of
    some stop sequence is held until it is decided; `flush()` returns it when the generation
    ends without a stop.
    """

    def __init__(self, stops):
        self._all = list(stops or [])
        self._stops = [s for s in self._all if s]
        self._held = ""
        self.met = None

    def push(self, text):
        if not self._stops:
            return text, False
        buf = self._held + text
        found = [(buf.find(stop), n) for n, stop in enumerate(self._all) if stop]
        hits = [hit for hit in found if hit[0] >= 0]
        if hits:
            self._held = ""
            at, self.met = min(hits)
            return buf[:at], True
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self):
        held, self._held = self._held, ""
        return held


def read_json(directory, name):
    """`directory/name` parsed, or {} when it is absent or unreadable."""
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def token_text(value):
    """A tokenizer_config token entry (`"<s>"` or `{"content": "<s>"}`) as text, or None."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def thinking_kwargs(thinking):
    """Template kwargs for a request's `thinking`: enable_thinking only when it is explicit."""
    if thinking == "enabled":
        return {"enable_thinking": True}
    if thinking == "disabled":
        return {"enable_thinking": False}
    return {}


def chat_messages(request):
    """The `messages` of an `auto` request, checked."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BridgeError("invalid_request", "prompt is null and messages is empty")
    return [{"role": m.get("role"), "content": m.get("content")} for m in messages]


def render_chat_template(directory, messages, thinking):
    """Renders tokenizer_config.json's `chat_template` (Hugging Face semantics) with jinja2.

    Raises `invalid_request` when the model has no chat template (set prompt_format then),
    and `missing_package` when jinja2 is not installed.
    """
    config = read_json(directory, "tokenizer_config.json")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise BridgeError(
            "invalid_request",
            f"the model in {directory} has no chat template (tokenizer_config.json "
            "chat_template); set the model's prompt_format",
        )
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise missing_package("jinja2", "needed to render the model's chat template") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, indent=None, ensure_ascii=False):
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    def strftime_now(fmt):
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=token_text(config.get("bos_token")) or "",
            eos_token=token_text(config.get("eos_token")) or "",
            **thinking_kwargs(thinking),
        )
    except jinja2.exceptions.TemplateError as e:
        raise BridgeError("invalid_request", f"the chat template failed: {e}") from None
