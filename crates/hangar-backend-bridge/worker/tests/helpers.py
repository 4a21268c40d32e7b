"""Shared test helpers: paths, fake engines on/off, a recording emit, the adapter test base."""

import contextlib
import importlib
import importlib.util
import os
import sys
import tempfile
import threading
import unittest

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


def wait_for(predicate, timeout=30.0):
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


class AdapterCase(unittest.TestCase):
    """What an engine adapter's tests share: stderr quiet, and every adapter `load` made
    unloaded after the test. A subclass sets `Adapter` (the adapter class) and, where it
    differs from the default:

    with_fakes: the fake engine packages (fakes/) importable, and their call record in
        `self.rec` (default True).
    model_path: the model directory `load` uses by default, also `self.path`; None (the
        default) makes a fresh empty one per test.
    default_settings: model settings (prompt_format, device included) every `load` gets
        unless it names them.
    """

    Adapter = None
    with_fakes = True
    model_path = None
    default_settings = {}

    def setUp(self):
        if self.model_path is None:
            self.path = self.enter(tempfile.TemporaryDirectory())
        else:
            self.path = self.model_path
        if self.with_fakes:
            self.rec = self.enter(fakes())
        self.enter(quiet())
        self.adapters = []
        self.addCleanup(self.unload_adapters)  # cleanups run in reverse: this one first

    def enter(self, context):
        """Enters `context` until the test's cleanup (unittest's enterContext before 3.11)."""
        value = context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)
        return value

    def unload_adapters(self):
        for adapter in self.adapters:
            adapter.unload()

    def load(self, path=None, **settings):
        """A new adapter loaded with `model(path, **settings)` (path: `self.path` by default,
        settings over `default_settings`): (adapter, its load result)."""
        adapter = self.Adapter()
        settings = {**self.default_settings, **settings}
        result = adapter.load(model(self.path if path is None else path, **settings))
        self.adapters.append(adapter)
        return adapter, result

    def run_generate(self, adapter, request, cancelled=None):
        """`adapter.generate(request)` to the end: (the text it emitted, its result)."""
        emitted = Emitted()
        result = adapter.generate(request, emitted, cancelled or threading.Event())
        return emitted.text, result


def check_missing_package(test, adapter_class, package):
    """Without the fakes, loading with `adapter_class` fails with `missing_package` naming
    `package` and this interpreter (skipped when the real package is installed)."""
    from hangar_bridge import BridgeError

    purge_fakes()
    if importlib.util.find_spec(package) is not None:
        test.skipTest(f"a real {package} is installed")
    with tempfile.TemporaryDirectory() as d:
        with test.assertRaises(BridgeError) as e:
            adapter_class().load(model(d))
    error = e.exception
    test.assertEqual(error.code, "missing_package")
    test.assertEqual(error.extra, {"package": package, "python": sys.executable})
    test.assertIn(f"pip install {package}", error.message)
    test.assertIn(sys.executable, error.message)


def check_embed_and_rerank_unsupported(test, adapter):
    """A generation engine answers embed and rerank with `unsupported`."""
    from hangar_bridge import BridgeError

    for call in (lambda: adapter.embed(["x"]), lambda: adapter.rerank("q", ["d"])):
        with test.assertRaises(BridgeError) as e:
            call()
        test.assertEqual(e.exception.code, "unsupported")
