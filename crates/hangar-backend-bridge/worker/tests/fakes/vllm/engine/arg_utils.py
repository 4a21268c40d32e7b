"""Fake vllm.engine.arg_utils."""

from fake_record import record


class AsyncEngineArgs:
    def __init__(self, **kwargs):
        record("AsyncEngineArgs", **kwargs)
        self.kwargs = kwargs
