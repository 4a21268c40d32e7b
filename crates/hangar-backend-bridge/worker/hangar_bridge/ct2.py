"""The CTranslate2 adapter: `ctranslate2.Generator` (decoder-only models) or
`ctranslate2.Translator` (encoder-decoder models), tokenized with the model directory's
`tokenizer.json` (the `tokenizers` package).

Settings: `ct2_compute_type` (default "default"), `ct2_inter_threads` (default 1: the
generations run at once, reported as max_parallel_sequences), `ct2_intra_threads` (default
0: CTranslate2 picks). The device is the load's `device` (`gpu` -> cuda, `cpu`), else cuda
when CTranslate2 sees a CUDA device.

Sampling: temperature 0 is greedy (top-k 1); temperature null is 1.0; top_k null samples from
the whole vocabulary (CTranslate2's top-k 0); top_p null is 1.0. The seed is ignored:
`generate_tokens` takes none, and `ctranslate2.set_random_seed` does not reseed the worker
threads' generators once they have sampled (checked with ctranslate2 4.8.5).

max_tokens null generates until an end token or a full context: config.json's
`max_position_embeddings`, else tokenizer_config.json's `model_max_length`, else 4096 tokens
(a generator's prompt included; a translator's whole source must fit in it, and its output
may fill it). End tokens: config.json's and tokenizer_config.json's eos tokens,
generation_config.json's eos ids, and `<|im_end|>` / `<|endoftext|>` when the vocabulary
has them. An explicit prompt is tokenized with the tokenizer's special tokens (e.g. a BOS its
post-processor adds); a rendered chat template without (the template writes them). A
translator translates the prompt with no target prefix, from config.json's
`decoder_start_token`.
"""

import os
import struct

from . import BridgeError, log, model_dir, require
from .text import (
    IncrementalDecoder,
    StopFilter,
    chat_messages,
    read_json,
    render_chat_template,
    token_text,
)

PACKAGES = ["ctranslate2", "tokenizers"]
DEFAULT_CONTEXT = 4096
CHAT_END_TOKENS = ["<|im_end|>", "<|endoftext|>"]
# Spec names written at the start of model.bin -> what runs them.
KINDS = {"TransformerDecoderSpec": "generator", "TransformerSpec": "translator"}


def spec_name(path):
    """The model spec's name in `path/model.bin`: uint32 binary version, then (version >= 2)
    a uint16 length and that many bytes, NUL-terminated (ctranslate2/specs/model_spec.py)."""
    try:
        with open(os.path.join(path, "model.bin"), "rb") as f:
            (version,) = struct.unpack("<I", f.read(4))
            if version < 2:
                return ""
            (length,) = struct.unpack("<H", f.read(2))
            return f.read(length).rstrip(b"\0").decode("utf-8")
    except (OSError, struct.error, UnicodeDecodeError) as e:
        raise BridgeError("load_failed", f"cannot read {path}/model.bin: {e}") from None


class Adapter:
    def __init__(self):
        self.engine = None

    def load(self, model):
        path = model_dir(model)
        require(PACKAGES)
        if model.get("prompt_format") == "auto":
            require(["jinja2"], "prompt_format auto renders the model's chat template")
        import ctranslate2
        import tokenizers

        name = spec_name(path)
        kind = KINDS.get(name)
        if kind is None:
            raise BridgeError(
                "load_failed",
                f"the CTranslate2 model in {path} is a {name or 'legacy'} model; "
                "only decoder-only generators and encoder-decoder translators are supported",
            )
        tokenizer_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise BridgeError("load_failed", f"{path} has no tokenizer.json")
        settings = model.get("settings") or {}
        device = {"gpu": "cuda", "cuda": "cuda", "cpu": "cpu"}.get(model.get("device"))
        if device is None:
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        inter = int(settings.get("ct2_inter_threads") or 1)
        intra = int(settings.get("ct2_intra_threads") or 0)
        engine_class = ctranslate2.Generator if kind == "generator" else ctranslate2.Translator
        try:
            self.engine = engine_class(
                path,
                device=device,
                compute_type=settings.get("ct2_compute_type") or "default",
                inter_threads=inter,
                intra_threads=intra,
            )
            self.tokenizer = tokenizers.Tokenizer.from_file(tokenizer_file)
        except Exception as e:  # noqa: BLE001 - CTranslate2 raises RuntimeError/ValueError
            self.engine = None
            raise BridgeError("load_failed", f"CTranslate2 refused {path}: {e}") from None
        self.kind, self.path = kind, path
        self.end_tokens = self._end_tokens(path)
        self.context = self._context(path)
        details = {
            "ctranslate2_version": ctranslate2.__version__,
            "kind": kind,
            "device": device,
            "compute_type": self.engine.compute_type,
            "inter_threads": inter,
            "intra_threads": intra,
            "tokenizer": "tokenizer.json",
            "end_tokens": self.end_tokens,
            "context_tokens": self.context,
            "seed": "ignored: CTranslate2 has no per-request seed",
        }
        log(f"loaded {path} as a CTranslate2 {kind} on {device} ({self.engine.compute_type})")
        return inter, details

    def _end_tokens(self, path):
        candidates = [
            token_text(read_json(path, "config.json").get("eos_token")),
            token_text(read_json(path, "tokenizer_config.json").get("eos_token")),
        ]
        ids = read_json(path, "generation_config.json").get("eos_token_id")
        for i in ids if isinstance(ids, list) else [ids]:
            if isinstance(i, int):
                candidates.append(self.tokenizer.id_to_token(i))
        candidates += CHAT_END_TOKENS
        ends = []
        for token in candidates:
            if token and token not in ends and self.tokenizer.token_to_id(token) is not None:
                ends.append(token)
        return ends

    def _context(self, path):
        n = read_json(path, "config.json").get("max_position_embeddings")
        if not isinstance(n, int) or n <= 0:
            n = read_json(path, "tokenizer_config.json").get("model_max_length")
        return n if isinstance(n, int) and 0 < n <= 1_000_000 else DEFAULT_CONTEXT

    def _sampling(self, params):
        temperature, top_k, top_p = (params.get(k) for k in ("temperature", "top_k", "top_p"))
        if temperature is not None and temperature <= 0:
            return {"sampling_topk": 1, "sampling_temperature": 1.0}
        return {
            "sampling_topk": int(top_k) if top_k else 0,
            "sampling_topp": float(top_p) if top_p is not None else 1.0,
            "sampling_temperature": float(temperature) if temperature is not None else 1.0,
        }

    def _tokens(self, request):
        """The prompt's tokens: the chat template's text, or the prompt with special tokens."""
        prompt = request.get("prompt")
        if prompt is None:
            messages = chat_messages(request)
            text = render_chat_template(self.path, messages, request.get("thinking"))
            return self.tokenizer.encode(text, add_special_tokens=False).tokens
        return self.tokenizer.encode(prompt, add_special_tokens=True).tokens

    def count(self, request):
        return len(self._tokens(request))

    def generate(self, request, emit, cancelled):
        tokens = self._tokens(request)
        if not tokens:
            raise BridgeError("invalid_request", "the prompt is empty")
        params = request.get("params") or {}
        room = self.context - (len(tokens) if self.kind == "generator" else 0)
        if room <= 0 or len(tokens) > self.context:
            raise BridgeError(
                "invalid_request",
                f"the prompt has {len(tokens)} tokens; the context holds {self.context}",
            )
        max_tokens = params.get("max_tokens")
        limit = min(int(max_tokens), room) if max_tokens else room
        options = dict(self._sampling(params), end_token=self.end_tokens)
        if self.kind == "generator":
            steps = self.engine.generate_tokens(tokens, max_length=limit, **options)
        else:  # max_input_length 0: the whole source (CTranslate2 cuts it at 1,024 by default)
            steps = self.engine.generate_tokens(
                tokens, max_decoding_length=limit, max_input_length=0, **options
            )
        decoder = IncrementalDecoder(
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        )
        stops = StopFilter(params.get("stop"))
        count, finish, stopped = 0, "length", False
        try:
            for step in steps:
                if cancelled.is_set():
                    raise BridgeError("cancelled", "cancelled")
                count += 1
                if step.token in self.end_tokens:
                    finish = "stop"
                    break
                out, stopped = stops.push(decoder.push(step.token_id))
                if out:
                    emit(out)
                if stopped:
                    finish = "stop"
                    break
        except BridgeError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever CTranslate2 raised while serving
            raise BridgeError("engine_error", f"CTranslate2 failed: {e}") from None
        finally:
            steps.close()  # stops CTranslate2's decoding loop
        if not stopped:
            out, stopped = stops.push(decoder.flush())
            out += "" if stopped else stops.flush()
            if out:
                emit(out)
            finish = "stop" if stopped else finish
        return finish, len(tokens), count, stops.met

    def embed(self, inputs):
        raise BridgeError("unsupported", "CTranslate2 models here generate text; no embeddings")

    def rerank(self, query, documents):
        raise BridgeError("unsupported", "CTranslate2 models here generate text; no reranking")

    def unload(self):
        import gc

        self.engine = None
        self.tokenizer = None
        gc.collect()
