"""The ct2 adapter with the real ctranslate2 on fixtures/models/tiny-ct2 (written by
xtask/fixtures/tiny_ct2.py). Skipped when ctranslate2 or tokenizers is not importable.

Run: target/bridge-venv/bin/python -m unittest discover \
    -s crates/hangar-backend-bridge/worker/tests -t crates/hangar-backend-bridge/worker
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

from tests.helpers import REPO, WORKER, Emitted, generate, model, quiet
from hangar_bridge import BridgeError

HAVE_CT2 = all(importlib.util.find_spec(p) for p in ("ctranslate2", "tokenizers"))
FIXTURE = os.path.join(REPO, "fixtures", "models", "tiny-ct2")
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
PROMPT_TOKENS = 19  # byte-level BPE of PROMPT: 3 special tokens, "user" is u-s-er, ...


@unittest.skipUnless(HAVE_CT2, "ctranslate2 and tokenizers are not importable")
class Ct2Test(unittest.TestCase):
    def setUp(self):
        from hangar_bridge.ct2 import Adapter

        self.Adapter = Adapter
        self.quiet = quiet()
        self.quiet.__enter__()
        self.adapters = []

    def tearDown(self):
        for adapter in self.adapters:
            adapter.unload()
        self.quiet.__exit__(None, None, None)

    def load(self, path=FIXTURE, **settings):
        adapter = self.Adapter()
        settings.setdefault("device", "cpu")
        result = adapter.load(model(path, **settings))
        self.adapters.append(adapter)
        return adapter, result

    def run_generate(self, adapter, request, cancelled=None):
        emitted = Emitted()
        result = adapter.generate(request, emitted, cancelled or threading.Event())
        return emitted, result

    def test_load_details(self):
        _, (parallel, details) = self.load(ct2_inter_threads=2, ct2_intra_threads=1)
        self.assertEqual(parallel, 2)
        self.assertEqual(details["kind"], "generator")
        self.assertEqual(details["device"], "cpu")
        self.assertEqual(details["compute_type"], "int8_float32")  # int8 weights on CPU
        self.assertEqual((details["inter_threads"], details["intra_threads"]), (2, 1))
        self.assertEqual(details["end_tokens"], ["<|im_end|>", "<|endoftext|>"])
        self.assertEqual(details["tokenizer"], "tokenizer.json")
        self.assertEqual(details["ctranslate2_version"], "4.8.5")

    def test_compute_type_setting(self):
        _, (parallel, details) = self.load(ct2_compute_type="float32")
        self.assertEqual((parallel, details["compute_type"]), (1, "float32"))

    def test_greedy_is_deterministic_printable_text(self):
        adapter, _ = self.load()
        first, result = self.run_generate(adapter, generate(PROMPT, max_tokens=24, temperature=0))
        second, _ = self.run_generate(adapter, generate(PROMPT, max_tokens=24, temperature=0))
        self.assertEqual(result, ("length", PROMPT_TOKENS, 24))
        self.assertEqual(first.text, second.text)
        self.assertTrue(first.text and all(32 <= ord(c) < 127 or c == "\n" for c in first.text),
                        first.text)
        self.assertNotIn("\ufffd", first.text)

    def test_sampling_reaches_the_end_token(self):
        adapter, _ = self.load()
        finishes = []
        for _ in range(12):
            _, result = self.run_generate(adapter, generate(PROMPT, max_tokens=400))
            finishes.append(result[0])
        self.assertIn("stop", finishes)

    def test_stop_sequence(self):
        adapter, _ = self.load()
        full, _ = self.run_generate(adapter, generate(PROMPT, max_tokens=24, temperature=0))
        stop = full.text[6:9]
        cut = full.text.index(stop)
        emitted, result = self.run_generate(
            adapter, generate(PROMPT, max_tokens=24, temperature=0, stop=[stop]))
        self.assertEqual((emitted.text, result[0]), (full.text[:cut], "stop"))

    def test_cancel(self):
        adapter, _ = self.load()
        cancelled = threading.Event()
        emitted = Emitted()

        def emit(text):
            emitted(text)
            cancelled.set()

        with self.assertRaises(BridgeError) as e:
            adapter.generate(generate(PROMPT, max_tokens=2000, temperature=0), emit, cancelled)
        self.assertEqual(e.exception.code, "cancelled")
        self.assertLess(len(emitted.text), 100)

    def test_auto_template_with_thinking(self):
        import tokenizers

        adapter, _ = self.load(prompt_format="auto")
        messages = [{"role": "user", "content": "hi"}]
        _, result = self.run_generate(adapter, generate(
            None, messages=messages, thinking="disabled", max_tokens=2, temperature=0))
        tok = tokenizers.Tokenizer.from_file(os.path.join(FIXTURE, "tokenizer.json"))
        rendered = PROMPT + "<think>\n\n</think>\n\n"
        self.assertEqual(result[1], len(tok.encode(rendered, add_special_tokens=False).ids))
        _, default = self.run_generate(adapter, generate(
            None, messages=messages, thinking="default", max_tokens=2, temperature=0))
        self.assertEqual(default[1], PROMPT_TOKENS)

    def test_no_chat_template_is_invalid_request(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m")
            shutil.copytree(FIXTURE, path)
            config_path = os.path.join(path, "tokenizer_config.json")
            with open(config_path) as f:
                config = json.load(f)
            del config["chat_template"]
            with open(config_path, "w") as f:
                json.dump(config, f)
            adapter, _ = self.load(path)
            with self.assertRaises(BridgeError) as e:
                messages = [{"role": "user", "content": "x"}]
                self.run_generate(adapter, generate(None, messages=messages))
        self.assertEqual(e.exception.code, "invalid_request")

    def test_not_found_and_not_a_model(self):
        with self.assertRaises(BridgeError) as e:
            self.load(os.path.join(FIXTURE, "absent"))
        self.assertEqual(e.exception.code, "not_found")
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(BridgeError) as e:
                self.load(d)
        self.assertEqual(e.exception.code, "load_failed")

    def test_embed_is_unsupported(self):
        adapter, _ = self.load()
        with self.assertRaises(BridgeError) as e:
            adapter.embed(["x"])
        self.assertEqual(e.exception.code, "unsupported")

    def test_worker_session(self):
        from tests.test_protocol import Worker, tokens_text

        w = Worker(with_fakes=False)
        self.addCleanup(w.close)
        self.assertEqual(w.call("hello", protocol=1)["type"], "hello")
        loaded = w.call("load", engine="ct2", model=model(FIXTURE, device="cpu",
                                                           ct2_compute_type="int8"))
        self.assertEqual(loaded["type"], "loaded", loaded)
        self.assertEqual(loaded["max_parallel_sequences"], 1)
        rid = w.send("generate", prompt=PROMPT, messages=None, thinking="default",
                     params={"max_tokens": 8, "temperature": 0, "top_p": None, "top_k": None,
                             "seed": None, "stop": []})
        messages = w.until_final(rid)
        self.assertEqual(messages[-1]["type"], "done")
        self.assertEqual(messages[-1]["completion_tokens"], 8)
        self.assertTrue(tokens_text(messages))
        self.assertEqual(w.call("unload")["type"], "ok")
        self.assertEqual(w.call("shutdown")["type"], "ok")
        self.assertEqual(w.proc.wait(10), 0)


class Ct2CheckTest(unittest.TestCase):
    def test_check_matches_what_is_installed(self):
        environ = dict(os.environ, PYTHONPATH=WORKER)
        proc = subprocess.run([sys.executable, "-m", "hangar_bridge", "--check", "ct2"],
                              env=environ, capture_output=True, text=True, timeout=30)
        out = json.loads(proc.stdout)
        if HAVE_CT2:
            self.assertEqual((proc.returncode, out["ok"]), (0, True))
            self.assertEqual(set(out["packages"]), {"ctranslate2", "tokenizers"})
        else:
            self.assertEqual((proc.returncode, out["code"]), (3, "missing_package"))
            self.assertIn(out["package"], ("ctranslate2", "tokenizers"))


if __name__ == "__main__":
    unittest.main()
