"""The in-process vLLM adapter against the fake vllm in fakes/ (no GPU, no real package).

Run: python3 -m unittest discover -s crates/hangar-backend-bridge/worker/tests \
    -t crates/hangar-backend-bridge/worker
"""

import importlib.util
import json
import os
import threading
import unittest

from tests import helpers
from tests.helpers import Emitted, env, generate, model
from hangar_bridge import BridgeError
from hangar_bridge.vllm import Adapter

ALL_FIELDS = {
    "vllm_max_model_len": 16384,
    "vllm_kv_cache_dtype": "fp8",
    "vllm_kv_cache_memory_bytes": 2147483648,
    "vllm_gpu_memory_utilization": 0.2,
    "vllm_dtype": "bfloat16",
    "vllm_tensor_parallel_size": 2,
    "vllm_max_pixels": 4014080,
    "vllm_mm_processor_kwargs": {"min_pixels": 3136, "max_pixels": 100, "fps": 2},
    "vllm_speculative_method": "mtp",
    "vllm_speculative_model": "google/gemma-4-26B-A4B-it-assistant",
    "vllm_num_speculative_tokens": 1,
}


class VllmTest(helpers.AdapterCase):
    Adapter = Adapter

    def engine_args(self, **settings):
        self.load(**settings)
        (args,) = self.rec.calls("AsyncEngineArgs")
        return args

    # -- engine arguments: as the `vllm serve` launcher maps them
    def test_every_field(self):
        adapter, (parallel, details) = self.load(**ALL_FIELDS)
        (args,) = self.rec.calls("AsyncEngineArgs")
        self.assertEqual(args, {
            "model": self.path,
            "max_model_len": 16384,
            "kv_cache_dtype": "fp8",
            "kv_cache_memory_bytes": 2147483648,
            "gpu_memory_utilization": 0.2,
            "dtype": "bfloat16",
            "tensor_parallel_size": 2,
            "speculative_config": {
                "method": "mtp",
                "model": "google/gemma-4-26B-A4B-it-assistant",
                "num_speculative_tokens": 1,
            },
            "mm_processor_kwargs": {"min_pixels": 3136, "max_pixels": 4014080, "fps": 2},
        })
        self.assertEqual(len(self.rec.calls("AsyncLLMEngine.from_engine_args")), 1)
        self.assertIsNone(parallel)
        self.assertEqual(details["vllm_version"], "0.0.0-fake")
        self.assertEqual(details["max_model_len"], 16384)

    def test_unset_fields_are_not_passed(self):
        self.assertEqual(self.engine_args(), {"model": self.path})

    def test_null_fields_are_not_passed(self):
        settings = {k: None for k in ALL_FIELDS}
        self.assertEqual(self.engine_args(**settings), {"model": self.path})

    def test_each_plain_field(self):
        for field, arg, value in [
            ("vllm_max_model_len", "max_model_len", 4096),
            ("vllm_kv_cache_dtype", "kv_cache_dtype", "fp8_e5m2"),
            ("vllm_kv_cache_memory_bytes", "kv_cache_memory_bytes", 268435456),
            ("vllm_gpu_memory_utilization", "gpu_memory_utilization", 0.05),
            ("vllm_dtype", "dtype", "float16"),
            ("vllm_tensor_parallel_size", "tensor_parallel_size", 1),
        ]:
            self.rec.CALLS.clear()
            self.assertEqual(self.engine_args(**{field: value}), {"model": self.path, arg: value})

    def test_speculative_method_alone(self):
        args = self.engine_args(vllm_speculative_method="draft_model")
        self.assertEqual(args["speculative_config"], {"method": "draft_model"})

    def test_speculative_model_without_method_is_not_passed(self):
        args = self.engine_args(vllm_speculative_model="x", vllm_num_speculative_tokens=3)
        self.assertNotIn("speculative_config", args)

    def test_speculative_method_and_tokens(self):
        args = self.engine_args(vllm_speculative_method="mtp", vllm_num_speculative_tokens=3)
        self.assertEqual(args["speculative_config"], {"method": "mtp", "num_speculative_tokens": 3})

    def test_max_pixels_alone(self):
        args = self.engine_args(vllm_max_pixels=200704)
        self.assertEqual(args["mm_processor_kwargs"], {"max_pixels": 200704})

    def test_mm_processor_kwargs_alone_and_empty(self):
        args = self.engine_args(vllm_mm_processor_kwargs={"do_pan_and_scan": True})
        self.assertEqual(args["mm_processor_kwargs"], {"do_pan_and_scan": True})
        self.rec.CALLS.clear()
        self.assertNotIn("mm_processor_kwargs", self.engine_args(vllm_mm_processor_kwargs={}))

    def test_max_pixels_does_not_change_the_configured_dict(self):
        configured = {"min_pixels": 1}
        self.engine_args(vllm_mm_processor_kwargs=configured, vllm_max_pixels=9)
        self.assertEqual(configured, {"min_pixels": 1})

    def test_missing_model_path_is_not_found(self):
        with self.assertRaises(BridgeError) as e:
            Adapter().load(model(os.path.join(self.path, "nope")))
        self.assertEqual(e.exception.code, "not_found")

    def test_a_hub_id_goes_to_vllm_as_it_is(self):
        self.load("Qwen/Qwen3-0.6B")
        (args,) = self.rec.calls("AsyncEngineArgs")
        self.assertEqual(args["model"], "Qwen/Qwen3-0.6B")

    # -- generation
    def test_generate_streams_deltas(self):
        adapter, _ = self.load()
        request = generate(prompt="abc", temperature=0.7, top_p=0.9, top_k=20, seed=3)
        text, result = self.run_generate(adapter, request)
        self.assertEqual(text, "Hello, world!")
        self.assertEqual(result, ("stop", 4, 6, None))  # the fake adds BOS to a text prompt
        (sampling,) = self.rec.calls("SamplingParams")
        self.assertEqual(sampling, {"max_tokens": None, "output_kind": "DELTA", "temperature": 0.7,
                                    "top_p": 0.9, "top_k": 20, "seed": 3})
        (call,) = self.rec.calls("generate")
        self.assertEqual(call["prompt"], "abc")
        self.assertTrue(call["request_id"].startswith("hangar-2-"))

    def test_count_is_the_prompt_generate_reads(self):
        adapter, _ = self.load(prompt_format="auto")
        messages = [{"role": "user", "content": "hi"}]
        chat = generate(prompt=None, messages=messages, thinking="enabled")
        for request in (generate(prompt="abc"), chat):
            counted = adapter.count(request)
            _, (_, prompt_tokens, _, _) = self.run_generate(adapter, request)
            self.assertEqual(counted, prompt_tokens, request)
        self.assertEqual(len(self.rec.calls("generate")), 2, "counting generates nothing")

    def test_max_tokens_is_length(self):
        adapter, _ = self.load()
        text, result = self.run_generate(adapter, generate(prompt="abc", max_tokens=2))
        self.assertEqual((text, result), ("Hello", ("length", 4, 2, None)))
        self.assertEqual(self.rec.calls("SamplingParams")[0]["max_tokens"], 2)

    def test_stop_sequences_go_to_vllm_and_the_worker(self):
        adapter, _ = self.load()
        text, result = self.run_generate(adapter, generate(prompt="abc", stop=["xyz", "lo, w"]))
        self.assertEqual((text, result[0], result[3]), ("Hel", "stop", 1))
        self.assertEqual(self.rec.calls("SamplingParams")[0]["stop"], ["xyz", "lo, w"])
        self.assertEqual(len(self.rec.calls("abort")), 1)

    def test_cancel_aborts_the_request(self):
        adapter, _ = self.load()
        cancelled = threading.Event()
        emitted = Emitted()

        def emit(text):
            emitted(text)
            cancelled.set()

        with env(FAKE_ENGINE_SCRIPT=json.dumps(["x"] * 1000), FAKE_ENGINE_DELAY="0.005"):
            with self.assertRaises(BridgeError) as e:
                adapter.generate(generate(prompt="abc", rid=9), emit, cancelled)
        self.assertEqual(e.exception.code, "cancelled")
        (abort,) = self.rec.calls("abort")
        self.assertTrue(abort["request_id"].startswith("hangar-9-"))
        self.assertLess(len(emitted.text), 1000)

    def test_concurrent_generations(self):
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

    def test_bad_sampling_parameters_are_invalid_request(self):
        adapter, _ = self.load()
        with self.assertRaises(BridgeError) as e:
            self.run_generate(adapter, generate(prompt="abc", temperature=-1))
        self.assertEqual(e.exception.code, "invalid_request")

    def test_auto_template_with_thinking(self):
        adapter, _ = self.load(prompt_format="auto")
        messages = [{"role": "user", "content": "hi"}]
        self.run_generate(adapter, generate(prompt=None, messages=messages, thinking="enabled"))
        self.run_generate(adapter, generate(prompt=None, messages=messages, thinking="default"))
        enabled, default = self.rec.calls("apply_chat_template")
        self.assertEqual(enabled, {"messages": messages, "tokenize": False,
                                   "add_generation_prompt": True, "enable_thinking": True})
        self.assertNotIn("enable_thinking", default)
        encoded = self.rec.calls("Tokenizer.encode")[0]
        self.assertFalse(encoded["add_special_tokens"])
        prompt = self.rec.calls("generate")[0]["prompt"]
        rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        self.assertEqual(prompt, {"prompt_token_ids": [ord(c) for c in rendered]})

    def test_unload_shuts_the_engine_down(self):
        adapter, _ = self.load()
        adapter.unload()
        self.adapters.remove(adapter)
        self.assertEqual(len(self.rec.calls("AsyncLLMEngine.shutdown")), 1)
        self.assertIsNone(adapter.loop)

    def test_embed_and_rerank_are_unsupported(self):
        helpers.check_embed_and_rerank_unsupported(self, self.load()[0])

    # -- sleep mode
    def test_sleep_mode_is_passed_only_when_true(self):
        self.assertEqual(self.engine_args(vllm_enable_sleep_mode=True),
                         {"model": self.path, "enable_sleep_mode": True})
        for off in (False, None):
            self.rec.CALLS.clear()
            self.assertEqual(self.engine_args(vllm_enable_sleep_mode=off), {"model": self.path})

    def greedy(self, adapter):
        return self.run_generate(adapter, generate(prompt="abc", temperature=0))

    def test_level_1_then_wake_answers_the_same(self):
        adapter, _ = self.load(vllm_enable_sleep_mode=True)
        before = self.greedy(adapter)
        adapter.sleep(1)
        adapter.sleep(1)  # asleep already: Ok, vLLM is not asked again
        self.assertEqual(self.rec.calls("sleep"), [{"level": 1}])
        with self.assertRaises(BridgeError) as e:
            self.greedy(adapter)
        self.assertEqual(e.exception.code, "engine_error")
        adapter.wake()
        self.assertEqual(self.rec.calls("wake_up"), [{"tags": None}])
        self.assertEqual(self.rec.calls("collective_rpc"), [])
        self.assertEqual(self.greedy(adapter), before)
        adapter.wake()  # awake already: Ok
        self.assertEqual(len(self.rec.calls("wake_up")), 1)

    def test_level_2_wake_reloads_the_weights(self):
        adapter, _ = self.load(vllm_enable_sleep_mode=True)
        before = self.greedy(adapter)
        adapter.sleep(2)
        self.assertEqual(self.rec.calls("sleep"), [{"level": 2}])
        adapter.wake()
        names = [n for n, _ in self.rec.CALLS if n in ("wake_up", "collective_rpc")]
        self.assertEqual(names, ["wake_up", "collective_rpc", "wake_up"])
        self.assertEqual(self.rec.calls("wake_up"), [{"tags": ["weights"]}, {"tags": ["kv_cache"]}])
        self.assertEqual(self.rec.calls("collective_rpc"), [{"method": "reload_weights"}])
        self.assertEqual(self.greedy(adapter), before)
        # Then level 1 again: nothing left of level 2.
        adapter.sleep(1)
        adapter.wake()
        self.assertEqual(len(self.rec.calls("collective_rpc")), 1)
        self.assertEqual(self.greedy(adapter), before)

    def test_the_fake_garbles_without_the_reload(self):
        # What the reload guards against: the fake vLLM woken whole after level 2 answers
        # from weights never read again, as vLLM would.
        adapter, _ = self.load(vllm_enable_sleep_mode=True)
        before = self.greedy(adapter)
        adapter.sleep(2)
        adapter.asleep = 1  # the adapter forgets the level: it wakes without the reload
        adapter.wake()
        text, result = self.greedy(adapter)
        self.assertNotEqual(text, before[0])
        self.assertEqual(result, before[1])

    def test_sleep_without_sleep_mode_is_unsupported(self):
        adapter, _ = self.load()
        for call in (lambda: adapter.sleep(1), adapter.wake):
            with self.assertRaises(BridgeError) as e:
                call()
            self.assertEqual(e.exception.code, "unsupported")
            self.assertIn("vllm_enable_sleep_mode", e.exception.message)
        self.assertEqual(self.rec.calls("sleep"), [])
        self.assertEqual(self.greedy(adapter)[0], "Hello, world!")

    def test_vllm_refusing_the_sleep_is_an_engine_error(self):
        # An engine started without sleep mode although the adapter thinks it has it: vLLM
        # raises, the adapter says so and stays awake.
        adapter, _ = self.load()
        adapter.sleep_mode = True
        with self.assertRaises(BridgeError) as e:
            adapter.sleep(2)
        self.assertEqual(e.exception.code, "engine_error")
        self.assertIn("Sleep mode is not enabled", e.exception.message)
        self.assertIsNone(adapter.asleep)
        self.assertEqual(self.greedy(adapter)[0], "Hello, world!")

    def test_a_sleep_vllm_does_not_confirm_is_an_engine_error(self):
        adapter, _ = self.load(vllm_enable_sleep_mode=True)

        async def stays_awake(level=1):
            pass

        adapter.engine.sleep = stays_awake
        with self.assertRaises(BridgeError) as e:
            adapter.sleep(1)
        self.assertEqual(e.exception.code, "engine_error")
        self.assertIn("is_sleeping() == False after sleep(1)", e.exception.message)
        self.assertIsNone(adapter.asleep)

    def test_sync_sleep_methods_are_called_too(self):
        # Some vLLM versions have sync methods: the adapter awaits only what is awaitable.
        adapter, _ = self.load(vllm_enable_sleep_mode=True)
        engine, state = adapter.engine, {"sleeping": False}

        def sleep(level=1):
            state["sleeping"] = True

        def wake_up(tags=None):
            state["sleeping"] = False

        engine.sleep, engine.wake_up = sleep, wake_up
        engine.is_sleeping = lambda: state["sleeping"]
        adapter.sleep(1)
        self.assertTrue(state["sleeping"])
        adapter.wake()
        self.assertFalse(state["sleeping"])


class MissingVllmTest(unittest.TestCase):
    def test_missing_package_names_it_and_the_interpreter(self):
        helpers.check_missing_package(self, Adapter, "vllm")


if __name__ == "__main__":
    unittest.main()
