"""The in-process vLLM adapter: `AsyncLLMEngine` (vLLM's V1 `AsyncLLM`) on an asyncio loop in a
background thread, so concurrent requests share continuous batching.

Engine arguments mirror the `vllm serve` launcher (hangar-backend-process launch.rs): only
the fields that are set are passed (unset -> vLLM's defaults):
  vllm_max_model_len -> max_model_len          vllm_kv_cache_dtype -> kv_cache_dtype
  vllm_kv_cache_memory_bytes -> kv_cache_memory_bytes
  vllm_gpu_memory_utilization -> gpu_memory_utilization
  vllm_dtype -> dtype                          vllm_tensor_parallel_size -> tensor_parallel_size
  vllm_speculative_method (+ vllm_speculative_model, vllm_num_speculative_tokens)
      -> speculative_config {"method", "model", "num_speculative_tokens"} (only with a method)
  vllm_mm_processor_kwargs, with vllm_max_pixels merged in as "max_pixels"
      -> mm_processor_kwargs (only when not empty)
  vllm_enable_sleep_mode -> enable_sleep_mode=True (only when true)

Generation: `SamplingParams(max_tokens=, output_kind=DELTA, temperature/top_p/top_k/seed/stop
when given)` and `engine.generate(prompt, params, request_id)`; a cancel aborts the request
with `engine.abort(request_id)`. An `auto` prompt is rendered with the engine tokenizer's
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
enable_thinking=...)` and sent as token ids without added special tokens (the template has
them). Embeddings and reranking are `unsupported`: a generate model has no pooling runner.

Sleep (only with vllm_enable_sleep_mode, else `unsupported`): `engine.sleep(level)` (1: the
weights to host memory, 2: the weights discarded; the KV cache goes at both). Waking from
level 1 is `engine.wake_up()`; from level 2 it is `wake_up(tags=["weights"])`,
`collective_rpc("reload_weights")`, then `wake_up(tags=["kv_cache"])`: woken without the
reload, vLLM answers from uninitialised memory. Each is confirmed with
`engine.is_sleeping()`; vLLM raising or saying otherwise is an `engine_error`. A model
asleep generates nothing (`engine_error`) until it is woken.
"""

import asyncio
import inspect
import itertools
import queue
import threading

import os

from . import BridgeError, free_torch_memory, import_failed, log, model_dir, require
from .text import StopFilter, chat_messages, thinking_kwargs

PACKAGES = ["vllm"]
POLL_S = 0.05
# setting -> AsyncEngineArgs field, passed through unchanged when set.
PLAIN_ARGS = {
    "vllm_max_model_len": "max_model_len",
    "vllm_kv_cache_dtype": "kv_cache_dtype",
    "vllm_kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "vllm_gpu_memory_utilization": "gpu_memory_utilization",
    "vllm_dtype": "dtype",
    "vllm_tensor_parallel_size": "tensor_parallel_size",
}
_serial = itertools.count(1)


def model_ref(model):
    """What vLLM loads: a local directory that must exist, or a Hugging Face hub id
    (`org/name`), which vLLM resolves itself (downloading it unless it is cached)."""
    path = model.get("model_path") or ""
    hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not os.path.exists(path)
    return path if hub_id else model_dir(model)


def engine_kwargs(model_path, settings):
    """AsyncEngineArgs keyword arguments for a load's settings (what `vllm serve` gets)."""
    kwargs = {"model": model_path}
    for field, arg in PLAIN_ARGS.items():
        if settings.get(field) is not None:
            kwargs[arg] = settings[field]
    method = settings.get("vllm_speculative_method")
    if method is not None:
        spec = {"method": method}
        if settings.get("vllm_speculative_model") is not None:
            spec["model"] = settings["vllm_speculative_model"]
        if settings.get("vllm_num_speculative_tokens") is not None:
            spec["num_speculative_tokens"] = settings["vllm_num_speculative_tokens"]
        kwargs["speculative_config"] = spec
    mm = dict(settings.get("vllm_mm_processor_kwargs") or {})
    if settings.get("vllm_max_pixels") is not None:
        mm["max_pixels"] = settings["vllm_max_pixels"]
    if mm:
        kwargs["mm_processor_kwargs"] = mm
    if settings.get("vllm_enable_sleep_mode") is True:
        kwargs["enable_sleep_mode"] = True
    return kwargs


class Adapter:
    def __init__(self):
        self.engine = None
        self.loop = None
        self.sleep_mode = False
        self.asleep = None  # the level it sleeps at; None awake
        self._sleep_lock = threading.Lock()

    def load(self, model):
        path = model_ref(model)
        require(PACKAGES)
        try:
            from vllm import SamplingParams
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.engine.async_llm_engine import AsyncLLMEngine
            from vllm.sampling_params import RequestOutputKind
        except ImportError as e:
            raise import_failed("vllm", e) from None
        self.SamplingParams, self.delta = SamplingParams, RequestOutputKind.DELTA
        kwargs = engine_kwargs(path, model.get("settings") or {})
        self.sleep_mode = kwargs.get("enable_sleep_mode", False)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()

        async def start():
            return AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**kwargs))

        try:
            self.engine = self._run(start())
        except Exception as e:  # noqa: BLE001 - whatever vLLM raised
            self._stop_loop()
            raise BridgeError("load_failed", f"vLLM refused {path}: {e}") from None
        details = {"vllm_version": _version(), **{k: v for k, v in kwargs.items() if k != "model"}}
        log(f"loaded {path} with vLLM {details['vllm_version']}")
        return None, details

    def _run(self, coroutine, timeout=None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _prompt(self, request):
        prompt = request.get("prompt")
        if prompt is not None:
            return prompt
        messages = chat_messages(request)

        async def render():
            tokenizer = self.engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # older vLLM: a coroutine
                tokenizer = await tokenizer
            text = tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=True,
                **thinking_kwargs(request.get("thinking")),
            )
            return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}

        try:
            return self._run(render())
        except Exception as e:  # noqa: BLE001 - no template, or the template raised
            raise BridgeError(
                "invalid_request",
                f"the model's chat template failed ({e}); set the model's prompt_format",
            ) from None

    def _sampling(self, params):
        kwargs = {"max_tokens": params.get("max_tokens"), "output_kind": self.delta}
        for key in ("temperature", "top_p", "top_k", "seed"):
            if params.get(key) is not None:
                kwargs[key] = params[key]
        if params.get("stop"):
            kwargs["stop"] = list(params["stop"])
        try:
            return self.SamplingParams(**kwargs)
        except (ValueError, TypeError) as e:
            raise BridgeError("invalid_request", f"vLLM sampling parameters: {e}") from None

    def count(self, request):
        """The prompt tokens `generate` would give vLLM: the template's ids as they are, a
        text prompt encoded as vLLM encodes it (with its special tokens)."""
        if self.engine is None:
            raise BridgeError("not_loaded", "no model is loaded")
        prompt = self._prompt(request)
        if isinstance(prompt, dict):
            return len(prompt["prompt_token_ids"])

        async def encode():
            tokenizer = self.engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):
                tokenizer = await tokenizer
            return tokenizer.encode(prompt)

        return len(self._run(encode()))

    def generate(self, request, emit, cancelled):
        if self.engine is None:
            raise BridgeError("not_loaded", "no model is loaded")
        if self.asleep is not None:
            raise BridgeError("engine_error", f"the model is asleep (level {self.asleep}); wake it")
        prompt = self._prompt(request)
        params = request.get("params") or {}
        sampling = self._sampling(params)
        request_id = f"hangar-{request.get('id')}-{next(_serial)}"
        deltas = queue.Queue()

        async def stream():
            async for output in self.engine.generate(prompt, sampling, request_id):
                deltas.put(("data", output))

        future = asyncio.run_coroutine_threadsafe(stream(), self.loop)
        future.add_done_callback(lambda f: deltas.put(("end", f)))
        stops = StopFilter(params.get("stop"))
        prompt_tokens = completion = 0
        finish = None
        while True:
            if cancelled.is_set():
                self._abort(request_id, future)
                raise BridgeError("cancelled", "cancelled")
            try:
                kind, value = deltas.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "end":
                error = None if value.cancelled() else value.exception()
                if error is not None:
                    code = "invalid_request" if isinstance(error, ValueError) else "engine_error"
                    raise BridgeError(code, f"vLLM: {error}") from None
                break
            prompt_tokens = len(getattr(value, "prompt_token_ids", None) or []) or prompt_tokens
            for piece in value.outputs[:1]:
                completion += len(piece.token_ids or [])
                out, stopped = stops.push(piece.text or "")
                if out:
                    emit(out)
                if stopped:
                    self._abort(request_id, future)
                    return "stop", prompt_tokens, completion, stops.met
                finish = piece.finish_reason or finish
        out = stops.flush()
        if out:
            emit(out)
        if finish == "abort":
            raise BridgeError("engine_error", "vLLM aborted the request")
        return ("length" if finish == "length" else "stop"), prompt_tokens, completion, None

    def _abort(self, request_id, future):
        try:
            self._run(self.engine.abort(request_id), timeout=10)
        except Exception as e:  # noqa: BLE001 - the request may be gone already
            log(f"vLLM abort of {request_id} failed: {e}")
        future.cancel()

    def embed(self, inputs):
        raise BridgeError("unsupported", "this vLLM engine generates text; no embeddings")

    def rerank(self, query, documents):
        raise BridgeError("unsupported", "this vLLM engine generates text; no reranking")

    def sleep(self, level):
        """vLLM's sleep at `level` (1 or 2), confirmed; asleep already is Ok."""
        with self._sleep_lock:
            self._can_sleep()
            if self.asleep is not None:
                return
            self._engine_call(f"sleep({level})", "sleep", level)
            self._confirm(True, f"sleep({level})")
            self.asleep = level
            log(f"asleep at vLLM level {level}")

    def wake(self):
        """Wakes the engine (reloading the weights after level 2), confirmed; awake already
        is Ok."""
        with self._sleep_lock:
            self._can_sleep()
            if self.asleep == 2:
                self._engine_call('wake_up(tags=["weights"])', "wake_up", tags=["weights"])
                self._engine_call('collective_rpc("reload_weights")', "collective_rpc",
                                  "reload_weights")
                self._engine_call('wake_up(tags=["kv_cache"])', "wake_up", tags=["kv_cache"])
            elif self.asleep is not None:
                self._engine_call("wake_up()", "wake_up")
            self._confirm(False, "the wake")
            if self.asleep is not None:
                log(f"awake from vLLM level {self.asleep}")
            self.asleep = None

    def _can_sleep(self):
        if self.engine is None:
            raise BridgeError("not_loaded", "no model is loaded")
        if not self.sleep_mode:
            raise BridgeError(
                "unsupported", "this vLLM model cannot sleep: vllm_enable_sleep_mode is off"
            )

    def _engine_call(self, what, method, *args, **kwargs):
        """`engine.<method>(*args, **kwargs)` on the loop, awaited when vLLM made it a
        coroutine; vLLM raising is an `engine_error` naming `what`."""

        async def call():
            result = getattr(self.engine, method)(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        try:
            return self._run(call())
        except Exception as e:  # noqa: BLE001 - whatever vLLM raised
            message = f"vLLM {what} failed: {type(e).__name__}: {e}"
            raise BridgeError("engine_error", message) from None

    def _confirm(self, sleeping, after):
        said = self._engine_call("is_sleeping()", "is_sleeping")
        if said is not sleeping:
            raise BridgeError(
                "engine_error", f"vLLM says is_sleeping() == {said!r} after {after}"
            )

    def unload(self):
        engine, self.engine = self.engine, None
        if engine is not None and hasattr(engine, "shutdown"):
            try:
                engine.shutdown()
            except Exception as e:  # noqa: BLE001 - freeing is best effort
                log(f"vLLM shutdown failed: {e}")
        del engine
        self._stop_loop()
        free_torch_memory()

    def _stop_loop(self):
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop = None


def _version():
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001 - not installed as a distribution (the test fake)
        import vllm

        return getattr(vllm, "__version__", None)
