"""Fake vllm.engine.async_llm_engine: AsyncLLMEngine streaming a scripted answer, with vLLM's
sleep mode (`sleep`, `wake_up`, `is_sleeping`, `collective_rpc("reload_weights")`) and its
state: level 1 keeps the weights in host memory; level 2 discards them, and woken without
`reload_weights` the engine answers from uninitialised memory (garbled text)."""

import asyncio

from fake_record import delay, record, render_chatml, script


class CompletionOutput:
    def __init__(self, text, token_ids, finish_reason):
        self.index = 0
        self.text = text
        self.token_ids = token_ids
        self.finish_reason = finish_reason


class RequestOutput:
    def __init__(self, request_id, prompt_token_ids, output, finished):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [output]
        self.finished = finished


class Tokenizer:
    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False, **kwargs):
        record("apply_chat_template", messages=messages, tokenize=tokenize,
               add_generation_prompt=add_generation_prompt, **kwargs)
        return render_chatml(messages, add_generation_prompt, kwargs.get("enable_thinking"))

    def encode(self, text, add_special_tokens=True):
        record("Tokenizer.encode", text=text, add_special_tokens=add_special_tokens)
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def garble(text):
    """What a model whose weights were never reloaded answers instead of `text`."""
    return "".join(chr(0x2400 + (ord(c) % 32)) for c in text)


class AsyncLLMEngine:
    def __init__(self, engine_args):
        self.engine_args = engine_args
        self.aborted = set()
        self.sleep_mode = bool(engine_args.kwargs.get("enable_sleep_mode"))
        self.asleep = set()  # the tags asleep: "weights", "kv_cache"
        self.weights = "loaded"  # "loaded", "host" (level 1), "discarded", "uninitialised"

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs):
        record("AsyncLLMEngine.from_engine_args", **kwargs)
        asyncio.get_running_loop()  # the adapter builds the engine on its loop
        return cls(engine_args)

    def get_tokenizer(self):
        return Tokenizer()

    async def generate(self, prompt, sampling_params, request_id):
        record("generate", prompt=prompt, request_id=request_id)
        if isinstance(prompt, dict):
            prompt_ids = list(prompt["prompt_token_ids"])
        else:
            prompt_ids = [1] + [ord(c) for c in prompt]
        pieces = script()
        if self.asleep or self.weights != "loaded":
            pieces = [garble(p) for p in pieces]
        limit = sampling_params.max_tokens
        produced = 0
        for i, text in enumerate(pieces):
            await asyncio.sleep(delay())
            if request_id in self.aborted:
                return
            produced += 1
            done = produced == limit or i == len(pieces) - 1
            finish = None
            if done:
                finish = "length" if produced == limit else "stop"
            yield RequestOutput(request_id, prompt_ids, CompletionOutput(text, [0], finish), done)
            if done:
                return

    async def abort(self, request_id):
        record("abort", request_id=request_id)
        self.aborted.add(request_id)

    def _check_sleep_mode(self):
        if not self.sleep_mode:
            raise AssertionError("Sleep mode is not enabled in the model config")

    async def sleep(self, level=1):
        record("sleep", level=level)
        self._check_sleep_mode()
        if self.asleep:
            return  # vLLM warns that it is already sleeping
        self.asleep = {"weights", "kv_cache"}
        self.weights = "host" if level == 1 else "discarded"

    async def wake_up(self, tags=None):
        record("wake_up", tags=tags)
        self._check_sleep_mode()
        for tag in tags or ["weights", "kv_cache"]:
            if tag == "weights" and "weights" in self.asleep:
                # Level 1 copies the weights back; level 2 only maps the memory again.
                self.weights = "loaded" if self.weights == "host" else "uninitialised"
            self.asleep.discard(tag)

    async def is_sleeping(self):
        return bool(self.asleep)

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        record("collective_rpc", method=method)
        if method != "reload_weights":
            raise AttributeError(f"'Worker' object has no attribute '{method}'")
        if "weights" in self.asleep:
            raise RuntimeError("reload_weights while the weights' memory is asleep")
        self.weights = "loaded"
        return [None]  # one result per worker

    def shutdown(self):
        record("AsyncLLMEngine.shutdown")
