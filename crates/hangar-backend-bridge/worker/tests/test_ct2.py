"""The ct2 adapter with the real ctranslate2: the Generator path on fixtures/models/tiny-ct2
(written by xtask/fixtures/tiny_ct2.py), the Translator path on its encoder-decoder
counterpart, which that script's `write` builds here in a temporary directory. Skipped when
ctranslate2 or tokenizers is not importable.

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

from tests.helpers import REPO, WORKER, AdapterCase, Emitted, generate, model
from hangar_bridge import BridgeError
from hangar_bridge.ct2 import Adapter

HAVE_CT2 = all(importlib.util.find_spec(p) for p in ("ctranslate2", "tokenizers"))
FIXTURE = os.path.join(REPO, "fixtures", "models", "tiny-ct2")
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
PROMPT_TOKENS = 19  # byte-level BPE of PROMPT: 3 special tokens, "user" is u-s-er, ...


def tiny_ct2():
    """xtask/fixtures/tiny_ct2.py as a module: what builds the tiny CTranslate2 models."""
    path = os.path.join(REPO, "xtask", "fixtures", "tiny_ct2.py")
    spec = importlib.util.spec_from_file_location("tiny_ct2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printable(text):
    return bool(text) and all(32 <= ord(c) < 127 or c == "\n" for c in text)


@unittest.skipUnless(HAVE_CT2, "ctranslate2 and tokenizers are not importable")
class Ct2Test(AdapterCase):
    Adapter = Adapter
    with_fakes = False
    model_path = FIXTURE
    default_settings = {"device": "cpu"}

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
        self.assertEqual(result, ("length", PROMPT_TOKENS, 24, None))
        self.assertEqual(first, second)
        self.assertTrue(printable(first), first)
        self.assertNotIn("\ufffd", first)

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
        stop = full[6:9]
        cut = full.index(stop)
        text, result = self.run_generate(
            adapter, generate(PROMPT, max_tokens=24, temperature=0, stop=[stop]))
        self.assertEqual((text, result[0], result[3]), (full[:cut], "stop", 0))

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

    def test_count_is_the_prompt_generate_reads(self):
        adapter, _ = self.load(prompt_format="auto")
        messages = [{"role": "user", "content": "hi"}]
        for thinking in ("enabled", "disabled"):
            request = generate(
                None, messages=messages, thinking=thinking, max_tokens=2, temperature=0)
            _, result = self.run_generate(adapter, request)
            self.assertEqual(adapter.count(request), result[1], thinking)
        self.assertEqual(adapter.count(generate(PROMPT, max_tokens=2)), PROMPT_TOKENS)

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


@unittest.skipUnless(HAVE_CT2, "ctranslate2 and tokenizers are not importable")
class Ct2TranslatorTest(AdapterCase):
    """An encoder-decoder model (`TransformerSpec`) through `ctranslate2.Translator`: the
    tiny-ct2 sizes, vocabulary and tokenizer, built once for the class (tens of ms)."""

    Adapter = Adapter
    with_fakes = False
    default_settings = {"device": "cpu"}

    @classmethod
    def setUpClass(cls):
        directory = tempfile.TemporaryDirectory()
        cls.addClassCleanup(directory.cleanup)
        cls.model_path = directory.name
        tiny_ct2().write(cls.model_path, translator=True)

    def greedy(self, adapter, max_tokens, prompt=PROMPT, **params):
        return self.run_generate(
            adapter, generate(prompt, max_tokens=max_tokens, temperature=0, **params))

    def test_load_details(self):
        _, (parallel, details) = self.load()
        self.assertEqual(parallel, 1)
        self.assertEqual(details["kind"], "translator")
        self.assertEqual(details["compute_type"], "int8_float32")
        self.assertEqual(details["end_tokens"], ["<|im_end|>", "<|endoftext|>"])
        self.assertEqual(details["context_tokens"], 4096)

    def test_greedy_streams_deterministic_text_up_to_max_tokens(self):
        adapter, _ = self.load()
        emitted = Emitted()
        result = adapter.generate(generate(PROMPT, max_tokens=24, temperature=0), emitted,
                                  threading.Event())
        self.assertEqual(result, ("length", PROMPT_TOKENS, 24, None))
        self.assertGreater(len(emitted.pieces), 1)  # streamed, not one piece at the end
        self.assertTrue(printable(emitted.text), emitted.text)
        again, _ = self.greedy(adapter, 24)
        self.assertEqual(again, emitted.text)
        short, result = self.greedy(adapter, 5)
        self.assertEqual(result, ("length", PROMPT_TOKENS, 5, None))
        self.assertTrue(short and emitted.text.startswith(short), (short, emitted.text))

    def test_stop_sequence(self):
        adapter, _ = self.load()
        full, _ = self.greedy(adapter, 24)
        stop = full[6:9]
        text, result = self.greedy(adapter, 24, stop=[stop])
        self.assertEqual((text, result[0]), (full[:full.index(stop)], "stop"))

    def test_sampling_reaches_the_end_token(self):
        adapter, _ = self.load()
        for _ in range(30):  # at temperature 3 about 3 samples in 4 end within 200 tokens
            text, result = self.run_generate(
                adapter, generate(PROMPT, max_tokens=200, temperature=3.0))
            if result[0] == "stop":
                break
        self.assertEqual(result[0], "stop")
        self.assertNotIn("<|", text)

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
        self.assertEqual(len(emitted.pieces), 1)

    def test_the_whole_source_must_fit_the_context(self):
        adapter, _ = self.load()
        # Longer than CTranslate2's default input cut (1,024 tokens; the adapter lifts it).
        _, result = self.greedy(adapter, 2, prompt="x" * 1100)  # "x" is one token
        self.assertEqual(result, ("length", 1100, 2, None))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m")
            shutil.copytree(self.path, path)
            config_path = os.path.join(path, "tokenizer_config.json")
            with open(config_path) as f:
                config = json.load(f)
            config["model_max_length"] = 16
            with open(config_path, "w") as f:
                json.dump(config, f)
            small, _ = self.load(path)
            with self.assertRaises(BridgeError) as e:
                self.greedy(small, None, prompt="x" * 17)
            self.assertEqual(e.exception.code, "invalid_request")
            # A source that fills the context: the translation may fill it too.
            _, result = self.greedy(small, None, prompt="x" * 16)
            self.assertEqual(result[1], 16)
            self.assertTrue(1 <= result[2] <= 16, result)


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
