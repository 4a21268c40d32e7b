"""The exllamav3 adapter against the fake exllamav3 in fakes/ (no GPU, no real package).

Run: python3 -m unittest discover -s crates/hangar-backend-bridge/worker/tests \
    -t crates/hangar-backend-bridge/worker
"""

import importlib.util
import json
import os
import threading
import unittest

from tests import helpers
from tests.helpers import Emitted, env, generate, model, wait_for
from hangar_bridge import BridgeError
from hangar_bridge.exllamav3 import Adapter


class ExllamaTest(helpers.AdapterCase):
    Adapter = Adapter

    def cache_call(self, **settings):
        self.load(**settings)
        (cache,) = self.rec.calls("Cache")
        return cache

    # -- load mapping
    def test_defaults_fp16_cache_of_8192_tokens(self):
        adapter, (parallel, details) = self.load()
        cache = self.rec.calls("Cache")[0]
        self.assertEqual(cache, {"max_num_tokens": 8192, "layer_type": "CacheLayer_fp16"})
        self.assertEqual(self.rec.calls("Config.from_directory"), [{"directory": self.path}])
        self.assertEqual(len(self.rec.calls("Model.load")), 1)
        self.assertEqual(self.rec.calls("Generator"),
                         [{"max_batch_size": 256, "max_chunk_size": 2048}])
        self.assertEqual(parallel, 256)
        self.assertEqual(details["cache_layer"], "CacheLayer_fp16")
        self.assertIsNone(details["cache_k_bits"])
        self.assertEqual(details["cache_tokens"], 8192)
        self.assertEqual(details["exllamav3_version"], "0.0.0-fake")

    def test_cache_size(self):
        self.assertEqual(self.cache_call(exllama_cache_size=32768)["max_num_tokens"], 32768)

    def test_quant_single_bits(self):
        cache = self.cache_call(exllama_cache_quant="8")
        self.assertEqual(cache, {"max_num_tokens": 8192, "layer_type": "CacheLayer_quant",
                                 "k_bits": 8, "v_bits": 8})

    def test_quant_pair(self):
        cache = self.cache_call(exllama_cache_size=32768, exllama_cache_quant="8,4")
        self.assertEqual(cache, {"max_num_tokens": 32768, "layer_type": "CacheLayer_quant",
                                 "k_bits": 8, "v_bits": 4})

    def test_k_v_bits_fields(self):
        cache = self.cache_call(exllama_cache_k_bits=8, exllama_cache_v_bits=4)
        self.assertEqual((cache["layer_type"], cache["k_bits"], cache["v_bits"]),
                         ("CacheLayer_quant", 8, 4))

    def test_null_quant_means_fp16(self):
        cache = self.cache_call(exllama_cache_quant=None, exllama_cache_k_bits=None,
                                exllama_cache_v_bits=None)
        self.assertEqual(cache, {"max_num_tokens": 8192, "layer_type": "CacheLayer_fp16"})

    def test_bad_cache_bits_fail_the_load(self):
        for settings in ({"exllama_cache_k_bits": 8}, {"exllama_cache_quant": "9"},
                         {"exllama_cache_quant": "8,4", "exllama_cache_k_bits": 8,
                          "exllama_cache_v_bits": 8}):
            with self.assertRaises(BridgeError) as e:
                Adapter().load(model(self.path, **settings))
            self.assertEqual(e.exception.code, "load_failed", settings)

    def test_max_rq_tokens_goes_to_every_job(self):
        adapter, _ = self.load(exllama_max_rq_tokens=512)
        self.run_generate(adapter, generate(max_tokens=2))
        self.assertEqual(self.rec.calls("Job")[0]["max_rq_tokens"], 512)

    def test_no_max_rq_tokens_by_default(self):
        adapter, _ = self.load()
        self.run_generate(adapter, generate(max_tokens=2))
        self.assertIsNone(self.rec.calls("Job")[0]["max_rq_tokens"])

    def test_missing_model_path_is_not_found(self):
        with self.assertRaises(BridgeError) as e:
            Adapter().load(model(os.path.join(self.path, "nope")))
        self.assertEqual(e.exception.code, "not_found")

    # -- generation
    def test_generate_streams_to_the_end_token(self):
        adapter, _ = self.load()
        request = generate(prompt="abc", temperature=0.5, top_k=40, seed=7)
        text, result = self.run_generate(adapter, request)
        self.assertEqual(text, "Hello, world!")
        self.assertEqual(result, ("stop", 3, 7, None))  # 6 pieces + the end token
        (job,) = self.rec.calls("Job")
        self.assertEqual(job["stop_conditions"], [2, 7])
        self.assertEqual(job["sampler"], {"temperature": 0.5, "top_k": 40})
        self.assertEqual(job["seed"], 7)
        self.assertEqual(job["max_new_tokens"], 8192 - 3)  # max_tokens null: the cache's room

    def test_max_tokens_is_length(self):
        adapter, _ = self.load()
        text, result = self.run_generate(adapter, generate(prompt="abc", max_tokens=3))
        self.assertEqual((text, result), ("Hello,", ("length", 3, 3, None)))
        self.assertEqual(self.rec.calls("Job")[0]["max_new_tokens"], 3)

    def test_stop_sequence_split_across_pieces(self):
        adapter, _ = self.load()
        # The job runs on (2,000 pieces more, 10 s) after the stop, so there is one to cancel.
        script = self.rec.DEFAULT_SCRIPT + ["."] * 2000
        with env(FAKE_ENGINE_SCRIPT=json.dumps(script), FAKE_ENGINE_DELAY="0.005"):
            text, result = self.run_generate(adapter, generate(prompt="abc", stop=["o, w"]))
        self.assertEqual(text, "Hell")
        self.assertEqual((result[0], result[3]), ("stop", 0))
        self.assertTrue(wait_for(lambda: self.rec.calls("Generator.cancel")))

    def test_cancel_cancels_the_job(self):
        adapter, _ = self.load()
        cancelled = threading.Event()
        emitted = Emitted()

        def emit(text):
            emitted(text)
            cancelled.set()

        with env(FAKE_ENGINE_SCRIPT=json.dumps(["x"] * 2000), FAKE_ENGINE_DELAY="0.005"):
            with self.assertRaises(BridgeError) as e:
                adapter.generate(generate(prompt="abc"), emit, cancelled)
        self.assertEqual(e.exception.code, "cancelled")
        self.assertLess(len(emitted.text), 2000)
        # The driver thread cancels the job soon after.
        self.assertTrue(wait_for(lambda: self.rec.calls("Generator.cancel")))

    def test_concurrent_generations_share_one_driver_thread(self):
        adapter, _ = self.load()
        results = []

        def one():
            results.append(self.run_generate(adapter, generate(prompt="abc")))

        with env(FAKE_ENGINE_DELAY="0.002"):
            threads = [threading.Thread(target=one) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        self.assertEqual([r[0] for r in results], ["Hello, world!"] * 4)

    def test_engine_failure_is_engine_error_and_the_adapter_stays_usable(self):
        adapter, _ = self.load()
        with env(FAKE_ENGINE_FAIL="1"):
            with self.assertRaises(BridgeError) as e:
                self.run_generate(adapter, generate(prompt="abc"))
        self.assertEqual(e.exception.code, "engine_error")
        self.assertIn("CUDA error", e.exception.message)
        text, result = self.run_generate(adapter, generate(prompt="abc"))
        self.assertEqual((text, result[0]), ("Hello, world!", "stop"))

    def test_job_too_large_for_the_cache_is_invalid_request(self):
        adapter, _ = self.load(exllama_cache_size=256)
        with self.assertRaises(BridgeError) as e:
            self.run_generate(adapter, generate(prompt="abc", max_tokens=1000))
        self.assertEqual(e.exception.code, "invalid_request")

    def test_auto_template_with_thinking(self):
        adapter, _ = self.load(prompt_format="auto")
        messages = [{"role": "user", "content": "hi"}]
        self.run_generate(adapter, generate(prompt=None, messages=messages, thinking="disabled"))
        self.run_generate(adapter, generate(prompt=None, messages=messages, thinking="default"))
        off, default = self.rec.calls("Tokenizer.hf_render_chat_template")
        self.assertEqual(off, {"messages": messages, "add_generation_prompt": True,
                               "enable_thinking": False})
        self.assertNotIn("enable_thinking", default)
        encoded = self.rec.calls("Tokenizer.encode")[0]
        self.assertTrue(encoded["text"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"))
        self.assertEqual((encoded["add_bos"], encoded["encode_special_tokens"]), (False, True))

    def test_rendered_prompt_gets_bos_when_the_tokenizer_adds_one(self):
        with open(os.path.join(self.path, "tokenizer_config.json"), "w") as f:
            json.dump({"add_bos_token": True, "bos_token": "<bos>"}, f)
        adapter, _ = self.load()
        self.run_generate(adapter, generate(prompt="abc", max_tokens=1))
        encoded = self.rec.calls("Tokenizer.encode")[0]
        self.assertEqual((encoded["text"], encoded["add_bos"]), ("abc", True))

    def test_qwen_style_prompt_gets_no_bos(self):
        with open(os.path.join(self.path, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": None, "eos_token": "<|im_end|>"}, f)
        adapter, _ = self.load()
        self.run_generate(adapter, generate(prompt="abc", max_tokens=1))
        self.assertFalse(self.rec.calls("Tokenizer.encode")[0]["add_bos"])

    def test_unload_releases_the_model(self):
        adapter, _ = self.load()
        adapter.unload()
        self.adapters.remove(adapter)
        self.assertEqual(len(self.rec.calls("Model.unload")), 1)
        self.assertIsNone(adapter.generator)

    def test_embed_and_rerank_are_unsupported(self):
        helpers.check_embed_and_rerank_unsupported(self, self.load()[0])


class MissingExllamaTest(unittest.TestCase):
    def test_missing_package_names_it_and_the_interpreter(self):
        helpers.check_missing_package(self, Adapter, "exllamav3")


if __name__ == "__main__":
    unittest.main()
