"""Fake vllm.sampling_params."""

from enum import Enum

from fake_record import record


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(self, **kwargs):
        record("SamplingParams", **{k: getattr(v, "name", v) for k, v in kwargs.items()})
        if kwargs.get("temperature") is not None and kwargs["temperature"] < 0:
            raise ValueError("temperature must be non-negative")
        self.max_tokens = kwargs.get("max_tokens", 16)
        self.output_kind = kwargs.get("output_kind", RequestOutputKind.CUMULATIVE)
        self.stop = kwargs.get("stop") or []
