"""Shared test helpers: paths, fake engines on/off, a recording emit."""

import contextlib
import importlib
import os
import sys
import threading

TESTS = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.dirname(TESTS)
FAKES = os.path.join(TESTS, "fakes")
REPO = os.path.abspath(os.path.join(WORKER, "..", "..", ".."))
FAKE_PACKAGES = ("exllamav3", "vllm", "fake_record")

if WORKER not in sys.path:
    sys.path.insert(0, WORKER)


def purge_fakes():
    """Forgets imported fake modules so the next import sees sys.path afresh."""
    for name in list(sys.modules):
        if name.split(".")[0] in FAKE_PACKAGES:
            del sys.modules[name]


@contextlib.contextmanager
def fakes():
    """The fake engine packages importable, with a fresh call record."""
    purge_fakes()
    sys.path.insert(0, FAKES)
    importlib.invalidate_caches()
    try:
        yield importlib.import_module("fake_record")
    finally:
        sys.path.remove(FAKES)
        purge_fakes()
        importlib.invalidate_caches()


@contextlib.contextmanager
def env(**values):
    """Environment variables set for the block (None removes one)."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Emitted:
    """An `emit` that keeps what it was given."""

    def __init__(self):
        self.pieces = []
        self.lock = threading.Lock()

    def __call__(self, text):
        with self.lock:
            self.pieces.append(text)

    @property
    def text(self):
        return "".join(self.pieces)


def model(engine_dir, **settings):
    """A load's `model` object for a directory."""
    return {
        "name": "m",
        "model_path": engine_dir,
        "type": "llm",
        "prompt_format": settings.pop("prompt_format", "qwen3_template"),
        "device": settings.pop("device", "gpu"),
        "target_inflight": 1,
        "replica": 0,
        "replicas": 1,
        "settings": settings,
    }


def generate(prompt="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", messages=None,
             thinking="default", rid=2, **params):
    base = {"max_tokens": None, "temperature": None, "top_p": None, "top_k": None,
            "seed": None, "stop": []}
    base.update(params)
    return {"id": rid, "op": "generate", "prompt": prompt, "messages": messages,
            "thinking": thinking, "params": base}


def wait_for(predicate, timeout=5.0):
    """Polls `predicate` until it is true (returns True) or `timeout` passes (False)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def quiet():
    """Sends the worker's log lines (stderr) nowhere for the block."""
    import io

    return contextlib.redirect_stderr(io.StringIO())
