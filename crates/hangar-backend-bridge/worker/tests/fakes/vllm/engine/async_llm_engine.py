"""Fake vllm.engine.async_llm_engine: AsyncLLMEngine streaming a scripted answer."""

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


class AsyncLLMEngine:
    def __init__(self, engine_args):
        self.engine_args = engine_args
        self.aborted = set()

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

    def shutdown(self):
        record("AsyncLLMEngine.shutdown")
