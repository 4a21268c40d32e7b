"""The GPU check's phases: each `(ctx, deadline)`, recording figures and checks in the report.

Budgets are seconds per mode (device, dry_run); the whole run's deadline cuts them further.
"""
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from support import (MIB, Hangard, PhaseTimeout, descendants, left, log, metric, poll, run,
                     smi_apps, smi_gpu, write_config)

# Two readings of an idle GPU's used memory, a moment apart, agree within this (MiB).
USED_TOLERANCE_MIB = 64
# nvidia-smi and NVML round the total the same way; allow for a MiB of rounding.
TOTAL_TOLERANCE_MIB = 2
# Memory counts as given back when the GPU's used memory is this close to the baseline.
RELEASE_TOLERANCE_MIB = 128
# Engine log lines worth keeping in the report: where its layers and buffers went.
DEVICE_WORDS = ("offload", "CUDA", "GPU", "VRAM", "buffer size")
# What each test model's engine gets.
N_CTX = 4096


@dataclass
class Ctx:
    """What one phase leaves to the next."""
    report: object
    mode: str
    bundle: str
    work: str
    out: str
    gguf_path: str = ""
    gguf_started: float = 0.0
    gguf_proc: object = None
    gguf: dict = field(default_factory=dict)
    llama_server: str = ""
    baseline_used_mib: int = 0
    a: dict = field(default_factory=dict)
    hangards: list = field(default_factory=list)
    pids: set = field(default_factory=set)

    def check(self, phase, name, ok, detail):
        return self.report.check(name, phase, ok, detail)

    def figures(self, phase):
        return self.report.figures(phase)


def setup(ctx, deadline):
    gpu = smi_gpu(deadline)
    machine = ctx.report.data["machine"]
    machine["gpu"] = gpu
    p = run(["nvcc", "--version"], deadline) if ctx.mode == "device" else None
    machine["nvcc"] = p.stdout.strip().splitlines()[-1] if p and p.returncode == 0 else None
    ctx.baseline_used_mib = gpu["used_mib"]
    ctx.figures("setup").update(gpu)
    ctx.check("setup", "nvidia_smi_reads_the_gpu", gpu["total_mib"] > 0 and gpu["compute_cap"],
              f"{gpu['name']}, compute capability {gpu['compute_cap']}, "
              f"{gpu['used_mib']} / {gpu['total_mib']} MiB used")


def build(ctx, deadline):
    f = ctx.figures("build")
    log_file = os.path.join(ctx.out, "build.log")
    started = time.monotonic()
    p = run(["tar", "-xzf", os.path.join(ctx.bundle, "llama.cpp.tar.gz"), "-C", ctx.work],
            deadline, log_file)
    f["unpack_s"] = round(time.monotonic() - started, 2)
    if p.returncode != 0:
        raise RuntimeError(f"tar failed ({p.returncode}); see build.log")
    source, tree = os.path.join(ctx.work, "llama.cpp"), os.path.join(ctx.work, "build")
    given = os.environ.get("GPU_CHECK_LLAMA_SERVER")
    f["build_tree_reused"] = os.path.isdir(tree)
    # Named before it exists: should the build fail, the later phases still start hangard.
    ctx.llama_server = given or os.path.join(tree, "bin", "llama-server")
    # Shared libraries: the carried hangard links llama.cpp's (`--features llama-cpp-shared`)
    # and finds these, with CUDA, through LD_LIBRARY_PATH (check.py).
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DGGML_CCACHE=OFF"]
    if given:
        options.append("-DGGML_NATIVE=OFF")  # the dry run only configures, for the CPU
    else:
        arch = ctx.report.data["machine"]["gpu"]["compute_cap"].replace(".", "")
        fa = os.environ.get("GPU_CHECK_CUDA_FA", "OFF")
        options += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}-real",
                    f"-DGGML_CUDA_FA={fa}", "-DGGML_CUDA_FA_QUANTS=f16-f16",
                    "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_COMPRESSION_MODE=none"]
        f["cuda_architectures"], f["cuda_fa"] = arch, fa
    generator = ["-G", "Ninja"] if run(["sh", "-c", "command -v ninja"], deadline).returncode == 0 else []
    f["generator"] = "Ninja" if generator else "Unix Makefiles"
    f["cmake_options"] = options
    started = time.monotonic()
    p = run(["cmake", "-S", source, "-B", tree, *generator, *options], deadline, log_file)
    f["configure_s"] = round(time.monotonic() - started, 2)
    ctx.check("build", "llama_cpp_tree_configures", p.returncode == 0,
              f"cmake configure of the carried tree: exit {p.returncode} in {f['configure_s']}s")
    if p.returncode != 0:
        raise RuntimeError("cmake configure failed; see build.log")
    if given:
        f["compile_s"], f["note"] = None, "dry run: configured only; the given binary runs"
    else:
        jobs = str(os.cpu_count() or 1)
        f["jobs"] = int(jobs)
        started = time.monotonic()
        p = run(["cmake", "--build", tree, "--target", "llama-server", "-j", jobs], deadline, log_file)
        f["compile_s"] = round(time.monotonic() - started, 2)
        libs = [n for n in ("libllama.so", "libggml.so", "libggml-cuda.so")
                if not os.path.exists(os.path.join(tree, "bin", n))]
        ctx.check("build", "cuda_llama_server_builds",
                  p.returncode == 0 and os.path.exists(ctx.llama_server) and not libs,
                  f"cmake --build --target llama-server -j {jobs}: exit {p.returncode} in "
                  f"{f['compile_s']}s; shared libraries missing: {libs or 'none'}")
        if p.returncode != 0:
            raise RuntimeError("the llama-server build failed; see build.log")
    f["binary_mib"] = round(os.path.getsize(ctx.llama_server) / MIB, 1)
    p = run([ctx.llama_server, "--version"], deadline)
    text = (p.stdout or "") + (p.stderr or "")
    f["version"] = [line for line in text.splitlines() if line.strip()][-4:]
    if ctx.mode == "device":
        # `--version` names no backend; `--list-devices` prints the devices the built
        # backends find (`CUDA0: NVIDIA H100 …` when ggml-cuda is in and sees the GPU).
        p = run([ctx.llama_server, "--list-devices"], deadline)
        devices = (p.stdout or "") + (p.stderr or "")
        f["devices"] = [line.strip() for line in devices.splitlines() if line.strip()][-4:]
        cuda = [line.strip() for line in devices.splitlines() if line.strip().startswith("CUDA")]
        ctx.check("build", "llama_server_sees_cuda", bool(cuda),
                  f"llama-server --list-devices: {cuda[0]}" if cuda else devices[-300:])
    f["total_s"] = round(f["unpack_s"] + f["configure_s"] + (f["compile_s"] or 0), 2)
    # Where hangard's in-process engine finds llama.cpp: the C libraries in this tree (with
    # CUDA), llama-cpp-sys-2's libllama-common beside hangard (its DT_RPATH, `lib`).
    p = run(["ldd", hangard_binary(ctx)], deadline)
    lines = [line.strip() for line in (p.stdout or "").splitlines()
             if "llama" in line or "ggml" in line or "not found" in line]
    f["hangard_libraries"] = lines
    if ctx.mode == "device":
        def where(name):
            return next((line.split("=>")[-1].split("(")[0].strip() for line in lines
                         if line.startswith(name)), "")
        bundled = os.path.join(ctx.bundle, "lib")
        ok = (not any("not found" in line for line in lines)
              and where("libllama.so").startswith(os.path.join(tree, "bin"))
              and where("libggml-cuda.so").startswith(os.path.join(tree, "bin"))
              and where("libllama-common.so").startswith(bundled))
        ctx.check("build", "hangard_links_the_cuda_libraries", ok, "; ".join(lines) or p.stderr[-300:])


def hangard_binary(ctx):
    return os.environ.get("GPU_CHECK_HANGARD") or os.path.join(ctx.bundle, "hangard")


def gguf(ctx, deadline):
    try:
        stdout, _ = ctx.gguf_proc.communicate(timeout=left(deadline))
    except (subprocess.TimeoutExpired, PhaseTimeout):
        ctx.gguf_proc.kill()
        raise PhaseTimeout("gguf.py still writing at the phase's deadline") from None
    if ctx.gguf_proc.returncode != 0:
        raise RuntimeError(f"gguf.py exit {ctx.gguf_proc.returncode}; see gguf.log")
    ctx.gguf = json.loads(stdout.strip().splitlines()[-1])
    ctx.gguf["ready_after_start_s"] = round(time.monotonic() - ctx.gguf_started, 2)
    ctx.figures("gguf").update(ctx.gguf)
    want = 2048 if ctx.mode == "device" else 1
    ctx.check("gguf", "gguf_written", ctx.gguf["mib"] >= want,
              f"{ctx.gguf['mib']} MiB ({ctx.gguf['shape']['layers']} layers) in {ctx.gguf['seconds']}s")


def settings(ctx, budget_mib=None, models=None):
    """hangard's settings: models a and b (`llama_server`, the GGUF on the GPU) unless
    `models` names others."""
    model = {"backend": "llama_server", "model_path": ctx.gguf_path, "device": "gpu",
             "llama_server_binary_path": ctx.llama_server, "llama_server_n_gpu_layers": -1,
             "llama_server_n_ctx": N_CTX, "load_timeout_s": 120,
             # No FlashAttention kernels are compiled unless GPU_CHECK_CUDA_FA=ON.
             "llama_server_flash_attn": "auto" if os.environ.get("GPU_CHECK_CUDA_FA") == "ON" else "off",
             "llama_server_extra_args": ["--no-webui"]}
    s = {"host": "127.0.0.1", "state_dir": os.path.join(ctx.work, "state"), "auto_load": False,
         "max_loaded_models": {"llm": 3}, "models": models or {"a": model, "b": dict(model)}}
    pass_env = os.environ.get("GPU_CHECK_CHILD_PASS_ENV")
    if pass_env:
        s["children"] = {"pass_env": pass_env.split(",")}
    if budget_mib is not None:
        s["vram_budget"] = budget_mib
    return s


def start(ctx, name, deadline, budget_mib=None, models=None):
    config = os.path.join(ctx.work, f"config-{name}")
    write_config(config, settings(ctx, budget_mib, models))
    h = Hangard(hangard_binary(ctx), config, os.path.join(ctx.out, f"hangard-{name}.log"), deadline)
    ctx.hangards.append(h)
    return h


def telemetry(ctx, deadline):
    h = start(ctx, "1", deadline)
    status, memory = h.get("/v1/admin/gpu-memory", deadline)
    _, metrics = h.get("/metrics", deadline)
    gpu = smi_gpu(deadline)
    ctx.baseline_used_mib = gpu["used_mib"]
    f = ctx.figures("telemetry")
    g = (memory.get("gpus") or [{}])[0] if isinstance(memory, dict) else {}
    f["gpu_memory"] = memory
    f["nvidia_smi"] = gpu
    f["metrics"] = {k: metric(metrics, k, 'gpu="0"') for k in
                    ("hangar_gpu_memory_used_bytes", "hangar_gpu_memory_total_bytes")}
    f["metrics"]["hangar_gpu_telemetry_available"] = next(
        (float(line.split()[-1]) for line in metrics.splitlines()
         if line.startswith("hangar_gpu_telemetry_available ")), None)
    ctx.check("telemetry", "gpu_memory_lists_the_gpu",
              status == 200 and memory.get("error") is None and g.get("name") == gpu["name"],
              f"{status}: {g.get('name')!r} (nvidia-smi {gpu['name']!r}), error {memory.get('error')!r}")
    for key, tolerance in (("used_mib", USED_TOLERANCE_MIB), ("total_mib", TOTAL_TOLERANCE_MIB)):
        ours = g.get(key)
        ctx.check("telemetry", f"gpu_memory_{key}_matches_nvidia_smi",
                  ours is not None and abs(ours - gpu[key]) <= tolerance,
                  f"hangar {ours} MiB, nvidia-smi {gpu[key]} MiB (tolerance {tolerance})")
    m = f["metrics"]
    used = m["hangar_gpu_memory_used_bytes"]
    total = m["hangar_gpu_memory_total_bytes"]
    ok = (m["hangar_gpu_telemetry_available"] == 1 and used is not None and total is not None
          and abs(used / MIB - gpu["used_mib"]) <= USED_TOLERANCE_MIB
          and abs(total / MIB - gpu["total_mib"]) <= TOTAL_TOLERANCE_MIB)
    ctx.check("telemetry", "metrics_match_nvidia_smi", ok,
              f"/metrics used {used and used / MIB:.0f} MiB, total {total and total / MIB:.0f} MiB; "
              f"nvidia-smi {gpu['used_mib']} / {gpu['total_mib']} MiB")


def engine_pids(h):
    """hangard's engine children and theirs."""
    return descendants(h.pid)


def child_environ(pid):
    """A process's environment (empty when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
    except (OSError, TypeError):
        return {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def gpu_mib_of(apps, pids):
    return sum(apps.get(p) or 0 for p in pids if p in apps)


def load(ctx, deadline):
    h = ctx.hangards[-1]
    f = ctx.figures("load")
    started = time.monotonic()
    status, row = h.post("/v1/admin/models/a/load", deadline)
    f["load_s"] = round(time.monotonic() - started, 2)
    ok = status == 200 and row.get("runtime_state") == "loaded"
    ctx.check("load", "model_a_loads_on_the_gpu", ok, f"{status}, state {row.get('runtime_state')!r}"
              if isinstance(row, dict) else f"{status}: {row}")
    if not ok:
        raise RuntimeError(f"load of a failed: {status} {row}")
    pids = engine_pids(h)
    ctx.pids.update(pids)
    apps = smi_apps(deadline)
    gpu = smi_gpu(deadline)
    detail = row.get("vram_detail") or {}
    tree = (detail.get("process_tree") or {}).get("mib")
    est = detail.get("gguf_estimate") or {}
    weights = est.get("weights_mib") or ctx.gguf.get("mib")
    delta = row.get("vram_estimate_mib") if row.get("vram_estimate_source") == "observed_load_delta" else None
    smi_tree = gpu_mib_of(apps, pids)
    f.update({"engine_pids": pids, "nvidia_smi_apps": {str(k): v for k, v in apps.items()},
              "nvidia_smi_tree_mib": smi_tree, "process_tree_mib": tree, "observed_delta_mib": delta,
              "gguf_estimate_mib": est.get("mib"), "gguf_weights_mib": weights,
              "gguf_kv_cache_mib": est.get("kv_cache_mib"), "admission_mib": detail.get("admission_mib"),
              "admission_method": detail.get("admission_method"),
              "nvidia_smi_used_mib": gpu["used_mib"],
              "nvidia_smi_delta_mib": gpu["used_mib"] - ctx.baseline_used_mib,
              "overhead_over_estimate_mib": (tree - est["mib"]) if tree and est.get("mib") else None})
    ctx.a = {"admission_mib": detail.get("admission_mib"), "estimate_mib": est.get("mib")}
    ctx.check("load", "process_tree_figure_is_measured",
              detail.get("admission_method") == "process_tree" and bool(tree),
              f"admission {detail.get('admission_mib')} MiB by {detail.get('admission_method')}")
    ctx.check("load", "process_tree_matches_nvidia_smi",
              tree is not None and abs(tree - smi_tree) <= USED_TOLERANCE_MIB,
              f"hangar {tree} MiB, nvidia-smi's compute apps of pids {pids}: {smi_tree} MiB")
    ctx.check("load", "weights_fully_on_the_gpu", bool(tree) and tree >= weights,
              f"the engine holds {tree} MiB, the GGUF is {weights} MiB")
    ctx.check("load", "observed_delta_covers_the_engine",
              delta is not None and tree is not None and delta >= tree - USED_TOLERANCE_MIB,
              f"observed delta {delta} MiB, process tree {tree} MiB")
    ctx.check("load", "gguf_estimate_is_a_lower_bound",
              est.get("mib") is not None and tree is not None and est["mib"] <= tree + USED_TOLERANCE_MIB,
              f"estimate {est.get('mib')} MiB (weights {weights} + KV {est.get('kv_cache_mib')} "
              f"for {est.get('n_ctx')} tokens), measured {tree} MiB")
    body = {"model": "a", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    started = time.monotonic()
    status, answer = h.post("/v1/completions", deadline, body)
    f["completion_s"] = round(time.monotonic() - started, 2)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    f["completion_usage"] = usage
    ctx.check("load", "completion_runs_on_the_gpu_engine", status == 200 and bool(usage),
              f"{status}, usage {usage}")
    # What the engine said of its devices and layers (llama.cpp's own words), from the log.
    with open(h.log.name, errors="replace") as log_file:
        f["engine_device_lines"] = [line.strip()[-200:] for line in log_file
                                    if 'model="a"' in line and any(w in line for w in DEVICE_WORDS)][:12]
    stopped = time.monotonic()
    code = h.stop(min(deadline, time.monotonic() + 30))
    f["sigterm_stop_s"] = round(time.monotonic() - stopped, 2)
    ctx.check("load", "hangard_drains_and_exits_0_on_sigterm", code == 0, f"exit {code}")
    # The driver frees an engine's memory a moment after it exits: the next hangard's
    # admission must not see it (and the wait is a figure of its own).
    try:
        gpu, _ = poll(deadline, lambda: idle_gpu(ctx, pids, deadline))
        f["memory_back_after_sigterm_s"] = round(time.monotonic() - stopped, 2)
        ok = True
    except PhaseTimeout:
        gpu, ok = smi_gpu(time.monotonic() + 10), False
    ctx.check("load", "sigterm_gives_the_gpu_memory_back", ok,
              f"used {gpu['used_mib']} MiB (baseline {ctx.baseline_used_mib}) "
              f"{f.get('memory_back_after_sigterm_s')}s after SIGTERM; engine pids {pids}")


def idle_gpu(ctx, pids, deadline):
    """GPU 0's reading once its used memory is back at the baseline and none of `pids`
    holds memory on it; None before."""
    gpu, apps = smi_gpu(deadline), smi_apps(deadline)
    back = gpu["used_mib"] <= ctx.baseline_used_mib + RELEASE_TOLERANCE_MIB
    return gpu if back and not set(pids) & set(apps) else None


def eviction(ctx, deadline):
    a, est = ctx.a.get("admission_mib"), ctx.a.get("estimate_mib")
    if not a or not est:
        raise RuntimeError("no figures of model a from the load phase")
    # b (the same GGUF) is admitted by its estimate: beside a it does not fit, alone it does;
    # beside b, a (counted by its measured figure) does not fit.
    budget = ctx.baseline_used_mib + a + est // 2
    for h in ctx.hangards:  # the load phase's, should it have ended early
        h.stop(min(deadline, time.monotonic() + 30))
    f = ctx.figures("eviction")
    f.update({"vram_budget_mib": budget, "baseline_used_mib": ctx.baseline_used_mib,
              "a_admission_mib": a, "b_estimate_mib": est})
    h = start(ctx, "2", deadline, budget)
    before = h.row("a", deadline)
    remembered = (before.get("vram_detail") or {}).get("admission_method")
    ctx.check("eviction", "measured_figure_survives_a_restart", remembered == "process_tree",
              f"a's admission figure after the restart: {(before.get('vram_detail') or {}).get('admission_mib')} "
              f"MiB by {remembered}")
    status, row = h.post("/v1/admin/models/a/load", deadline)
    ctx.check("eviction", "a_loads_under_the_budget", status == 200, f"{status}")
    started = time.monotonic()
    status, row = h.post("/v1/admin/models/b/load", deadline)
    f["b_load_s"] = round(time.monotonic() - started, 2)
    state_a = h.row("a", deadline).get("runtime_state")
    f["b_load_status"], f["a_state_after_b"] = status, state_a
    ctx.check("eviction", "b_evicts_a_for_memory", status == 200 and state_a == "unloaded",
              f"load b: {status}; a is {state_a!r}")
    # The placement path on this machine's one GPU: the grant chose GPU 0, the row says so,
    # and the engine child runs confined to it, in PCI bus order.
    placement = row.get("placement") if isinstance(row, dict) else None
    details = (row.get("runtime_details") or [{}]) if isinstance(row, dict) else [{}]
    env = child_environ(details[0].get("pid"))
    f["b_placement"] = placement
    f["b_child_cuda"] = {k: env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    placed = {k: (placement or {}).get(k) for k in ("gpus", "source")}
    held_on = [x.get("gpu") for x in (placement or {}).get("holds") or []]
    ctx.check("eviction", "b_is_placed_on_gpu_0",
              placed == {"gpus": [0], "source": "chosen"} and held_on == [0],
              f"placement {placement}")
    # What the GPU child keeps on the host (its runtime, pinned buffers) is measured too.
    host = (row.get("host_memory") if isinstance(row, dict) else None) or {}
    f["b_host_memory"] = host
    ctx.check("eviction", "b_host_part_is_measured",
              host.get("method") == "process_tree_rss" and (host.get("mib") or 0) > 0,
              f"host_memory {host}")
    ctx.check("eviction", "b_child_sees_gpu_0_in_pci_bus_order",
              env.get("CUDA_VISIBLE_DEVICES") == "0" and env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID",
              f"child environment {f['b_child_cuda']}")
    ctx.pids.update(engine_pids(h))
    status, lease = h.post("/v1/admin/models/b/leases", deadline, {"owner": "gpu-check", "ttl_seconds": 600})
    ctx.check("eviction", "b_is_leased", status == 200, f"{status}")
    status, refused = h.post("/v1/admin/models/a/load", deadline)
    error = refused.get("error", {}) if isinstance(refused, dict) else {}
    shortfall = error.get("vram_shortfall")
    f["refusal"] = {"status": status, "code": error.get("code"), "vram_shortfall": shortfall}
    holders = (shortfall or {}).get("holders") or []
    sides = [g.get("gpu") for g in (shortfall or {}).get("gpus") or []]
    ctx.check("eviction", "a_is_refused_507_insufficient_vram",
              status == 507 and error.get("code") == "insufficient_vram"
              and any(x.get("model") == "b" and x.get("held") for x in holders) and sides == [0],
              f"{status} {error.get('code')}, shortfall {shortfall}")
    state_b = h.row("b", deadline).get("runtime_state")
    ctx.check("eviction", "the_refusal_evicts_nothing", state_b == "loaded", f"b is {state_b!r}")
    _, memory = h.get("/v1/admin/gpu-memory", deadline)
    shown = ((memory.get("gpus") or [{}])[0]).get("budget_mib")
    ctx.check("eviction", "gpu_memory_shows_the_budget", shown == budget, f"{shown} (configured {budget})")


def release(ctx, deadline):
    h = ctx.hangards[-1]
    pids = engine_pids(h)
    f = ctx.figures("release")
    f["used_before_mib"] = smi_gpu(deadline)["used_mib"]
    started = time.monotonic()
    status, _ = h.post("/v1/admin/models/b/unload", deadline)
    f["unload_request_s"] = round(time.monotonic() - started, 2)

    try:
        gpu, _ = poll(deadline, lambda: idle_gpu(ctx, pids, deadline))
    except PhaseTimeout:
        ctx.check("release", "memory_comes_back_after_unload", False,
                  f"unload {status}; used still {smi_gpu(time.monotonic() + 10)['used_mib']} MiB "
                  f"(baseline {ctx.baseline_used_mib}) at the phase's deadline")
        raise
    f["memory_back_s"] = round(time.monotonic() - started, 2)
    f["used_after_mib"] = gpu["used_mib"]
    ctx.check("release", "memory_comes_back_after_unload", status == 200,
              f"unload {status}; used {f['used_before_mib']} -> {gpu['used_mib']} MiB "
              f"(baseline {ctx.baseline_used_mib}) {f['memory_back_s']}s after the request")


def kill(ctx, deadline):
    h = ctx.hangards[-1]
    f = ctx.figures("kill")
    status, _ = h.post("/v1/admin/models/a/load", deadline)
    pids = engine_pids(h)
    ctx.pids.update(pids)
    apps = smi_apps(deadline)
    f.update({"load_status": status, "engine_pids": pids, "on_gpu_before": sorted(set(pids) & set(apps))})
    ctx.check("kill", "an_engine_is_on_the_gpu_before_the_kill", status == 200 and bool(set(pids) & set(apps)),
              f"load {status}; engine pids {pids} on the GPU: {f['on_gpu_before']}")
    started = time.monotonic()
    h.kill9()

    def gone():
        apps = smi_apps(deadline)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and not zombie(p)]
        return (apps, alive) if not set(pids) & set(apps) and not alive else None

    try:
        (apps, _), _ = poll(deadline, gone)
        f["gone_s"] = round(time.monotonic() - started, 2)
        ok, detail = True, f"no engine of hangard on the GPU {f['gone_s']}s after kill -9"
    except PhaseTimeout:
        apps = smi_apps(time.monotonic() + 10)
        ok, detail = False, f"still listed: {sorted(set(pids) & set(apps))}"
    f["nvidia_smi_apps_after"] = {str(k): v for k, v in apps.items()}
    f["used_after_mib"] = smi_gpu(time.monotonic() + 10)["used_mib"]
    ctx.check("kill", "no_process_of_hangard_on_the_gpu_after_kill_9", ok, detail)


def zombie(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        return stat[stat.rindex(")") + 2] == "Z"
    except (OSError, ValueError, IndexError):
        return True


def cleanup(ctx):
    """Whatever is still running ends: hangards, their engines, the GGUF writer."""
    for h in ctx.hangards:
        if h.proc.poll() is None:
            ctx.pids.update(descendants(h.pid))
            h.proc.kill()
            h.proc.wait()
    for pid in ctx.pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if ctx.gguf_proc and ctx.gguf_proc.poll() is None:
        ctx.gguf_proc.kill()
    try:
        os.remove(ctx.gguf_path)
    except OSError:
        pass


# (name, budget per mode in seconds, body). docs/gpu-check.md explains each.
PHASES = [
    ("setup", {"device": 20, "dry_run": 20}, setup),
    ("build", {"device": 330, "dry_run": 120}, build),
    ("gguf", {"device": 60, "dry_run": 60}, gguf),
    ("telemetry", {"device": 30, "dry_run": 30}, telemetry),
    ("load", {"device": 90, "dry_run": 60}, load),
    ("eviction", {"device": 90, "dry_run": 60}, eviction),
    ("release", {"device": 40, "dry_run": 30}, release),
    ("kill", {"device": 45, "dry_run": 30}, kill),
]
