"""The GPU check's sleep phase: the warm tier of the in-process llama.cpp engine on the GPU.

`hangard` #3 serves model c, the check's GGUF through the in-process engine (every layer on
the GPU, on the CUDA libraries the build phase made). c loads cold, answers greedily, sleeps
(its contexts and KV cache freed, the weights kept: llama.cpp cannot move them to the host),
wakes by the admin route and again by a request, and must answer as before. On the device,
`nvidia-smi` says what the sleep gave back, what stayed, and that the wake took it again;
the dry run (CPU engine, pretend GPU) checks the same routes, rows and answers.
"""
import os
import time

from phases import RELEASE_TOLERANCE_MIB, USED_TOLERANCE_MIB, start
from support import smi_apps, smi_gpu

# c's context: each of its sequences may use this many tokens; the KV cache (all of them)
# is what a sleep frees besides the compute buffers.
N_CTX_C = 4096
# The memory a sleep gives back must be at least this part of the KV cache's estimate.
FREED_SHARE_OF_KV = 0.5
PROMPT = "hello world"


def model_c(ctx):
    """c: the check's GGUF, in-process; every layer on the GPU on the device, the CPU in
    the dry run (whose llama.cpp sees no GPU)."""
    c = {"backend": "llama_cpp", "model_path": ctx.gguf_path, "load_timeout_s": 120,
         "gguf_n_ctx": N_CTX_C if ctx.mode == "device" else 1024}
    if ctx.mode == "device":
        c.update({"device": "gpu", "gguf_n_gpu_layers": -1,
                  # No FlashAttention kernels are compiled unless GPU_CHECK_CUDA_FA=ON.
                  "gguf_flash_attn": "auto" if os.environ.get("GPU_CHECK_CUDA_FA") == "ON" else "off"})
    else:
        c["device"] = "cpu"
    return c


def answer(h, deadline):
    """(status, greedy text, seconds) of one completion of c."""
    body = {"model": "c", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    started = time.monotonic()
    status, out = h.post("/v1/completions", deadline, body)
    text = out["choices"][0]["text"] if status == 200 and isinstance(out, dict) else None
    return status, text, round(time.monotonic() - started, 3)


def timed_post(h, path, deadline):
    started = time.monotonic()
    status, row = h.post(path, deadline)
    return status, row if isinstance(row, dict) else {"body": row}, round(time.monotonic() - started, 3)


def reading(h, deadline):
    """GPU 0's used memory and what hangard's own process holds there (MiB)."""
    return smi_gpu(deadline)["used_mib"], smi_apps(deadline).get(h.pid) or 0


def sleep(ctx, deadline):
    device = ctx.mode == "device"
    f = ctx.figures("sleep")
    h = start(ctx, "3", deadline, models={"c": model_c(ctx)})
    f["baseline_used_mib"], _ = reading(h, deadline)
    status, row, f["load_s"] = timed_post(h, "/v1/admin/models/c/load", deadline)
    loaded = status == 200 and row.get("runtime_state") == "loaded"
    ctx.check("sleep", "c_loads_in_process", loaded, f"{status}, state {row.get('runtime_state')!r}, "
              f"cold load {f['load_s']}s")
    if not loaded:
        raise RuntimeError(f"load of c failed: {status} {row}")
    est = (row.get("vram_detail") or {}).get("gguf_estimate") or {}
    f["gguf_weights_mib"], f["gguf_kv_cache_mib"] = est.get("weights_mib"), est.get("kv_cache_mib")
    f["used_loaded_mib"], f["hangard_loaded_mib"] = reading(h, deadline)
    status, before, f["completion_s"] = answer(h, deadline)
    f["answer"] = before
    ctx.check("sleep", "c_answers_before_sleeping", status == 200 and before is not None,
              f"{status}: {before!r} in {f['completion_s']}s")

    status, row, f["sleep_s"] = timed_post(h, "/v1/admin/models/c/sleep", deadline)
    residency = row.get("residency") or {}
    f["residency_asleep"] = residency
    ctx.check("sleep", "c_sleeps_and_stays_loaded",
              status == 200 and row.get("runtime_state") == "loaded"
              and residency.get("state") == "asleep" and residency.get("level") == "context",
              f"{status}: state {row.get('runtime_state')!r}, residency {residency} in {f['sleep_s']}s")
    status, _ = h.get("/v2/models/c/ready", deadline)
    ctx.check("sleep", "a_sleeping_model_is_ready", status == 200, f"/v2/models/c/ready: {status}")
    f["used_asleep_mib"], f["hangard_asleep_mib"] = reading(h, deadline)
    f["smi_freed_mib"] = f["used_loaded_mib"] - f["used_asleep_mib"]
    if device:
        kv, weights = f["gguf_kv_cache_mib"] or 0, f["gguf_weights_mib"] or ctx.gguf.get("mib") or 0
        freed, said = f["smi_freed_mib"], residency.get("gpu_freed_mib")
        ctx.check("sleep", "sleep_gives_gpu_memory_back",
                  kv > 0 and freed >= kv * FREED_SHARE_OF_KV
                  and said is not None and abs(said - freed) <= USED_TOLERANCE_MIB,
                  f"nvidia-smi: used {f['used_loaded_mib']} -> {f['used_asleep_mib']} MiB "
                  f"({freed} freed; KV cache estimate {kv}); the row says {said} freed, "
                  f"{residency.get('gpu_held_mib')} held")
        ctx.check("sleep", "weights_stay_on_the_gpu_while_asleep",
                  weights > 0 and f["hangard_asleep_mib"] >= weights,
                  f"hangard holds {f['hangard_asleep_mib']} MiB asleep (was {f['hangard_loaded_mib']}); "
                  f"the weights are {weights} MiB")

    status, row, f["wake_s"] = timed_post(h, "/v1/admin/models/c/wake", deadline)
    state = (row.get("residency") or {}).get("state")
    ctx.check("sleep", "c_wakes", status == 200 and state == "awake",
              f"{status}: residency {state!r} in {f['wake_s']}s (cold load {f['load_s']}s)")
    f["used_woken_mib"], f["hangard_woken_mib"] = reading(h, deadline)
    status, after, f["completion_after_wake_s"] = answer(h, deadline)
    ctx.check("sleep", "c_answers_as_before_after_waking", status == 200 and after == before,
              f"{status}: {after!r}, before sleeping {before!r}")
    if device:
        ctx.check("sleep", "wake_takes_the_memory_back",
                  abs(f["used_woken_mib"] - f["used_loaded_mib"]) <= RELEASE_TOLERANCE_MIB,
                  f"used {f['used_loaded_mib']} loaded, {f['used_asleep_mib']} asleep, "
                  f"{f['used_woken_mib']} woken (MiB)")

    # Asleep again, a request wakes it (counted in the queue like an auto-load).
    status, _, f["second_sleep_s"] = timed_post(h, "/v1/admin/models/c/sleep", deadline)
    status, woken, f["completion_that_wakes_s"] = answer(h, deadline)
    state = (h.row("c", deadline).get("residency") or {}).get("state")
    ctx.check("sleep", "a_request_wakes_c_with_the_same_answer",
              status == 200 and woken == before and state == "awake",
              f"{status}: {woken!r} in {f['completion_that_wakes_s']}s, residency {state!r}")
    f["wake_over_load"] = round(f["wake_s"] / f["load_s"], 3) if f["load_s"] else None
    code = h.stop(min(deadline, time.monotonic() + 30))
    ctx.check("sleep", "hangard_3_exits_0_on_sigterm", code == 0, f"exit {code}")


# (name, budget per mode in seconds, body), run after phases.PHASES.
PHASE = ("sleep", {"device": 45, "dry_run": 45}, sleep)
