"""A fake `exllamav3` (1.x API surface used by hangar_bridge/exllamav3.py) that records calls."""

import os
import threading
import time

from fake_record import CALLS, delay, record, render_chatml, script  # noqa: F401

__version__ = "0.0.0-fake"


class FakeIds:
    """Stands in for a (1, n) torch tensor of token ids."""

    def __init__(self, ids):
        self.ids = list(ids)
        self.shape = (1, len(self.ids))


class Config:
    def __init__(self, directory):
        self.directory = directory
        self.eos_token_id_list = [2, 7]
        self.max_position_embeddings = 4096

    @staticmethod
    def from_directory(directory, **kwargs):
        record("Config.from_directory", directory=directory, **kwargs)
        return Config(directory)


class Model:
    def __init__(self, config):
        self.config = config

    @staticmethod
    def from_config(config, **kwargs):
        record("Model.from_config", directory=config.directory, **kwargs)
        return Model(config)

    def load(self, **kwargs):
        record("Model.load", **kwargs)
        gate, deadline = os.environ.get("FAKE_ENGINE_LOAD_GATE"), time.monotonic() + 60
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)

    def unload(self):
        record("Model.unload")


class CacheLayer_fp16:  # noqa: N801 - exllamav3's name
    pass


class CacheLayer_quant:  # noqa: N801 - exllamav3's name
    pass


class Cache:
    def __init__(self, model, max_num_tokens, layer_type=None, max_batch_size=16, **kwargs):
        record(
            "Cache",
            max_num_tokens=max_num_tokens,
            layer_type=getattr(layer_type, "__name__", layer_type),
            **kwargs,
        )
        self.model = model
        self.max_num_tokens = max_num_tokens


class Tokenizer:
    eos_token_id = 2
    bos_token_id = 1

    @staticmethod
    def from_config(config):
        record("Tokenizer.from_config", directory=config.directory)
        return Tokenizer()

    def encode(self, text, add_bos=False, add_eos=False, encode_special_tokens=False, **kwargs):
        record("Tokenizer.encode", text=text, add_bos=add_bos,
               encode_special_tokens=encode_special_tokens)
        return FakeIds(([self.bos_token_id] if add_bos else []) + [ord(c) for c in text])

    def hf_render_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        record("Tokenizer.hf_render_chat_template", messages=messages,
               add_generation_prompt=add_generation_prompt, **kwargs)
        return render_chatml(messages, add_generation_prompt, kwargs.get("enable_thinking"))


class ComboSampler:
    def __init__(self, **kwargs):
        record("ComboSampler", **kwargs)
        self.kwargs = kwargs


class Job:
    def __init__(self, input_ids, max_new_tokens=None, min_new_tokens=0, sampler=None, seed=None,
                 stop_conditions=None, identifier=None, max_rq_tokens=None, **kwargs):
        record("Job", prompt_len=input_ids.shape[-1], max_new_tokens=max_new_tokens,
               sampler=getattr(sampler, "kwargs", sampler), seed=seed,
               stop_conditions=stop_conditions, identifier=identifier,
               max_rq_tokens=max_rq_tokens, **kwargs)
        self.max_new_tokens = max_new_tokens - 1 or 1  # as exllamav3 does: None raises
        self.requested = max_new_tokens
        self.input_ids = input_ids
        self.identifier = identifier
        self.max_rq_tokens = max_rq_tokens
        self.produced = 0
        self.started = False


class Generator:
    def __init__(self, model, cache, tokenizer, max_batch_size=256, max_chunk_size=2048, **kwargs):
        record("Generator", max_batch_size=max_batch_size, max_chunk_size=max_chunk_size, **kwargs)
        self.cache = cache
        self.max_batch_size = max_batch_size
        self.jobs = []
        self.owner = None

    def _check_thread(self):
        # exllamav3's generator is not thread-safe: the adapter must use one thread for it.
        me = threading.get_ident()
        if self.owner is None:
            self.owner = me
        assert self.owner == me, "Generator used from two threads"

    def num_remaining_jobs(self):
        self._check_thread()
        return len(self.jobs)

    def enqueue(self, job):
        self._check_thread()
        record("Generator.enqueue", identifier=job.identifier)
        need = job.input_ids.shape[-1] + (job.max_rq_tokens or job.requested)
        assert need <= self.cache.max_num_tokens, f"Job requires {need} tokens, cache too small"
        self.jobs.append(job)
        return len(self.jobs)

    def cancel(self, job):
        self._check_thread()
        record("Generator.cancel", identifier=job.identifier)
        if job in self.jobs:
            self.jobs.remove(job)

    def clear_queue(self):
        self._check_thread()
        self.jobs.clear()

    def iterate(self):
        self._check_thread()
        time.sleep(delay())
        if os.environ.get("FAKE_ENGINE_FAIL"):
            raise RuntimeError("CUDA error: the fake failed")
        pieces = script()
        results = []
        for job in list(self.jobs):
            base = {"job": job, "identifier": job.identifier, "serial": 0, "eos": False}
            if not job.started:
                job.started = True
                results.append(dict(base, stage="started"))
                continue
            if job.produced < len(pieces):
                text = pieces[job.produced]
                job.produced += 1
                result = dict(base, stage="streaming", text=text, token_ids=FakeIds([0]))
                if job.produced >= job.requested:
                    result.update(eos=True, eos_reason="max_new_tokens", new_tokens=job.produced)
            else:  # the end token: not streamed as text
                job.produced += 1
                result = dict(base, stage="streaming", text="", token_ids=FakeIds([2]), eos=True,
                              eos_reason="stop_token", eos_triggering_token_id=2,
                              new_tokens=job.produced)
            if result["eos"]:
                self.jobs.remove(job)
            results.append(result)
        return results
