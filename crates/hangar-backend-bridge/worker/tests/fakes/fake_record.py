"""Call recording shared by the fake engine packages (see README.md)."""

import json
import os
import threading

CALLS = []
_lock = threading.Lock()
DEFAULT_SCRIPT = ["Hel", "lo", ",", " wor", "ld", "!"]


def record(name, **kwargs):
    """Notes one call: in CALLS, and as a JSON line in $FAKE_ENGINE_RECORD when set."""
    with _lock:
        CALLS.append((name, kwargs))
        path = os.environ.get("FAKE_ENGINE_RECORD")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"call": name, "args": kwargs}, default=repr) + "\n")


def calls(name):
    """The kwargs of every recorded call named `name`, in order."""
    return [kwargs for n, kwargs in CALLS if n == name]


def script():
    """The text pieces a fake generation streams."""
    raw = os.environ.get("FAKE_ENGINE_SCRIPT")
    return json.loads(raw) if raw else list(DEFAULT_SCRIPT)


def delay():
    return float(os.environ.get("FAKE_ENGINE_DELAY") or 0)


def render_chatml(messages, add_generation_prompt=True, enable_thinking=None):
    """A Qwen3-style ChatML rendering, for the fakes' chat templates."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    if add_generation_prompt:
        text += "<|im_start|>assistant\n"
        if enable_thinking is False:
            text += "<think>\n\n</think>\n\n"
    return text
