"""A fake `vllm` (the API surface used by hangar_bridge/vllm.py) that records calls."""

from fake_record import CALLS  # noqa: F401

from .sampling_params import SamplingParams  # noqa: F401

__version__ = "0.0.0-fake"
