"""The ExLlamaV3 adapter (github.com/turboderp-org/exllamav3, exllamav3 1.x).

Load: `Config.from_directory`, `Model.from_config`, `Cache(model, max_num_tokens=...,
layer_type=CacheLayer_fp16 | CacheLayer_quant, k_bits=, v_bits=)`, `model.load()`,
`Tokenizer.from_config`, `Generator(model=, cache=, tokenizer=)`.

Settings: `exllama_cache_size` -> the cache's max_num_tokens (default 8192, the default of
exllamav3's model_init.py); `exllama_cache_quant` "<bits>" or "<k>,<v>", or
`exllama_cache_k_bits` + `exllama_cache_v_bits` -> a CacheLayer_quant cache with those bits;
none of them -> a CacheLayer_fp16 cache; `exllama_max_rq_tokens` -> each Job's
`max_rq_tokens` (how many tokens a job generates before it is requeued, which bounds the
cache pages one job takes per round).

The generator is not thread-safe: one driver thread owns it (enqueue, cancel, iterate) and
hands each job's results to the job's queue; `generate` runs on the request's thread, waits
on that queue and asks the driver to cancel the job when the request is cancelled or a stop
sequence is found. max_parallel_sequences is the generator's max_batch_size (the generator
also limits concurrency by free cache pages). Stop conditions given to the engine are the
model's end token ids; stop sequences are the worker's (text.StopFilter). Sampling is
`ComboSampler(temperature=, top_k=, top_p=)` with only the given fields. max_tokens null
means up to the cache size minus the prompt.
"""

import queue
import threading

from . import BridgeError, free_torch_memory, import_failed, log, model_dir, require
from .text import StopFilter, chat_messages, read_json, render_chat_template, thinking_kwargs

PACKAGES = ["exllamav3"]
DEFAULT_CACHE_TOKENS = 8192
POLL_S = 0.05


def cache_bits(settings):
    """(k_bits, v_bits) of a quantized cache, or None for fp16."""

    def bits(value):
        try:
            b = int(str(value).strip())
        except ValueError:
            b = 0
        if not 2 <= b <= 8:
            raise BridgeError("load_failed", f"cache bits must be 2..8, got {value!r}")
        return b

    quant = settings.get("exllama_cache_quant")
    k, v = settings.get("exllama_cache_k_bits"), settings.get("exllama_cache_v_bits")
    pair = None
    if k is not None or v is not None:
        if k is None or v is None:
            raise BridgeError(
                "load_failed", "exllama_cache_k_bits and exllama_cache_v_bits go together"
            )
        pair = (bits(k), bits(v))
    if quant:
        parts = str(quant).split(",")
        if len(parts) > 2:
            raise BridgeError("load_failed", f"exllama_cache_quant {quant!r}: '<b>' or '<k>,<v>'")
        q = (bits(parts[0]), bits(parts[-1]))
        if pair is not None and pair != q:
            raise BridgeError(
                "load_failed",
                f"exllama_cache_quant {quant!r} disagrees with exllama_cache_k_bits/v_bits {pair}",
            )
        return q
    return pair


def wants_bos(path):
    """Whether a rendered prompt gets the BOS token: tokenizer_config.json's add_bos_token,
    else whether it names a bos_token (Gemma and Llama do, Qwen does not)."""
    config = read_json(path, "tokenizer_config.json")
    if isinstance(config.get("add_bos_token"), bool):
        return config["add_bos_token"]
    return bool(config.get("bos_token"))


class Adapter:
    def __init__(self):
        self.generator = None
        self._driver = None

    def load(self, model):
        path = model_dir(model)
        require(PACKAGES)
        try:
            from exllamav3 import (
                Cache,
                CacheLayer_fp16,
                CacheLayer_quant,
                ComboSampler,
                Config,
                Generator,
                Job,
                Model,
                Tokenizer,
            )
        except ImportError as e:
            raise import_failed("exllamav3", e) from None
        settings = model.get("settings") or {}
        bits = cache_bits(settings)
        self.cache_tokens = int(settings.get("exllama_cache_size") or DEFAULT_CACHE_TOKENS)
        self.max_rq_tokens = settings.get("exllama_max_rq_tokens")
        self.Job, self.ComboSampler, self.path = Job, ComboSampler, path
        self.model = None
        try:
            config = Config.from_directory(path)
            self.model = Model.from_config(config)
            if bits is None:
                cache = Cache(
                    self.model, max_num_tokens=self.cache_tokens, layer_type=CacheLayer_fp16
                )
            else:
                cache = Cache(
                    self.model,
                    max_num_tokens=self.cache_tokens,
                    layer_type=CacheLayer_quant,
                    k_bits=bits[0],
                    v_bits=bits[1],
                )
            self.model.load()
            self.tokenizer = Tokenizer.from_config(config)
            self.generator = Generator(model=self.model, cache=cache, tokenizer=self.tokenizer)
        except BridgeError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever exllamav3 raised
            self._release()
            raise BridgeError("load_failed", f"exllamav3 refused {path}: {e}") from None
        ends = getattr(config, "eos_token_id_list", None) or [self.tokenizer.eos_token_id]
        self.stop_tokens = [t for t in ends if isinstance(t, int)]
        self.add_bos = wants_bos(path)
        self._commands = queue.Queue()
        self._driver = threading.Thread(target=self._drive, name="exllamav3-driver", daemon=True)
        self._driver.start()
        batch = getattr(self.generator, "max_batch_size", None)
        details = {
            "exllamav3_version": _version(),
            "cache_tokens": self.cache_tokens,
            "cache_layer": "CacheLayer_fp16" if bits is None else "CacheLayer_quant",
            "cache_k_bits": bits[0] if bits else None,
            "cache_v_bits": bits[1] if bits else None,
            "max_rq_tokens": self.max_rq_tokens,
            "max_batch_size": batch,
            "stop_token_ids": self.stop_tokens,
        }
        cache_name = "fp16" if bits is None else f"k{bits[0]}/v{bits[1]}"
        log(f"loaded {path} with exllamav3 ({self.cache_tokens} token {cache_name} cache)")
        return batch if isinstance(batch, int) else None, details

    # The driver thread: the only one that touches self.generator after load.
    def _drive(self):
        streams = {}
        while True:
            if streams and not self.generator.num_remaining_jobs():
                for q in streams.values():  # the generator dropped them (it should not)
                    q.put(("error", RuntimeError("the generator dropped the job")))
                streams.clear()
            block = not self.generator.num_remaining_jobs()
            try:
                while True:
                    command = self._commands.get(block=block)
                    block = False
                    if command[0] == "stop":
                        for q in streams.values():
                            q.put(("error", BridgeError("not_loaded", "the model was unloaded")))
                        self.generator.clear_queue()
                        return
                    if command[0] == "enqueue":
                        _, job, q = command
                        try:
                            self.generator.enqueue(job)
                            streams[job] = q
                        except Exception as e:  # noqa: BLE001 - e.g. the job does not fit
                            q.put(("refused", e))
                    elif command[0] == "cancel" and streams.pop(command[1], None) is not None:
                        self.generator.cancel(command[1])
            except queue.Empty:
                pass
            if not self.generator.num_remaining_jobs():
                continue
            try:
                results = self.generator.iterate()
            except Exception as e:  # noqa: BLE001 - fail every running job, keep serving
                log(f"exllamav3 generator failed: {e}")
                for q in streams.values():
                    q.put(("error", e))
                streams.clear()
                self.generator.clear_queue()
                continue
            for result in results:
                job = result.get("job")
                q = streams.get(job)
                if q is None or result.get("stage") != "streaming":
                    continue
                q.put(("data", result))
                if result.get("eos"):
                    streams.pop(job, None)

    def _prompt_ids(self, request):
        prompt = request.get("prompt")
        if prompt is not None:
            return self.tokenizer.encode(prompt, add_bos=self.add_bos, encode_special_tokens=True)
        messages = chat_messages(request)
        kwargs = thinking_kwargs(request.get("thinking"))
        try:
            text = self.tokenizer.hf_render_chat_template(
                messages, add_generation_prompt=True, **kwargs
            )
        except ImportError:  # exllamav3 renders with transformers; fall back to jinja2
            text = render_chat_template(self.path, messages, request.get("thinking"))
        except Exception as e:  # noqa: BLE001 - no template, or the template raised
            raise BridgeError(
                "invalid_request",
                f"the model's chat template failed ({e}); set the model's prompt_format",
            ) from None
        return self.tokenizer.encode(text, add_bos=False, encode_special_tokens=True)

    def count(self, request):
        if self.generator is None:
            raise BridgeError("not_loaded", "no model is loaded")
        return int(self._prompt_ids(request).shape[-1])

    def generate(self, request, emit, cancelled):
        if self.generator is None:
            raise BridgeError("not_loaded", "no model is loaded")
        ids = self._prompt_ids(request)
        prompt_tokens = int(ids.shape[-1])
        params = request.get("params") or {}
        max_tokens = params.get("max_tokens")
        if not max_tokens:
            max_tokens = self.cache_tokens - prompt_tokens
            if max_tokens <= 0:
                raise BridgeError(
                    "invalid_request",
                    f"the prompt has {prompt_tokens} tokens; the cache holds {self.cache_tokens}",
                )
        sampling = {
            k: params[k] for k in ("temperature", "top_k", "top_p") if params.get(k) is not None
        }
        extra = {"max_rq_tokens": int(self.max_rq_tokens)} if self.max_rq_tokens else {}
        try:
            job = self.Job(
                input_ids=ids,
                max_new_tokens=int(max_tokens),
                stop_conditions=list(self.stop_tokens),
                sampler=self.ComboSampler(**sampling),
                seed=params.get("seed"),
                identifier=request.get("id"),
                **extra,
            )
        except (AssertionError, ValueError, TypeError) as e:
            raise BridgeError("invalid_request", f"exllamav3 refused the job: {e}") from None
        results = queue.Queue()
        self._commands.put(("enqueue", job, results))
        stops = StopFilter(params.get("stop"))
        count = 0
        while True:
            if cancelled.is_set():
                self._commands.put(("cancel", job))
                raise BridgeError("cancelled", "cancelled")
            try:
                kind, value = results.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "refused":  # enqueue refused the job (it cannot fit the cache)
                raise BridgeError("invalid_request", f"exllamav3 refused the job: {value}")
            if kind == "error":
                if isinstance(value, BridgeError):
                    raise value
                raise BridgeError("engine_error", f"exllamav3: {value}") from None
            ids_out = value.get("token_ids")
            count += int(ids_out.shape[-1]) if hasattr(ids_out, "shape") else 1
            eos = bool(value.get("eos"))
            out, stopped = stops.push(value.get("text") or "")
            if eos and not stopped:
                out += stops.flush()
            if out:
                emit(out)
            if stopped:
                if not eos:
                    self._commands.put(("cancel", job))
                return "stop", prompt_tokens, count, stops.met
            if eos:
                count = int(value.get("new_tokens", count))
                finish = "length" if value.get("eos_reason") == "max_new_tokens" else "stop"
                return finish, prompt_tokens, count, None

    def embed(self, inputs):
        raise BridgeError("unsupported", "exllamav3 models generate text; no embeddings")

    def rerank(self, query, documents):
        raise BridgeError("unsupported", "exllamav3 models generate text; no reranking")

    def unload(self):
        if self._driver is not None:
            self._commands.put(("stop",))
            self._driver.join(timeout=30)
            self._driver = None
        self._release()

    def _release(self):
        self.generator = None
        if getattr(self, "model", None) is not None:
            try:
                self.model.unload()
            except Exception as e:  # noqa: BLE001 - freeing is best effort
                log(f"exllamav3 model.unload failed: {e}")
            self.model = None
        free_torch_memory()


def _version():
    try:
        from importlib.metadata import version

        return version("exllamav3")
    except Exception:  # noqa: BLE001 - not installed as a distribution (the test fake)
        import exllamav3

        return getattr(exllamav3, "__version__", None)
