"""Hangar's GPU check: one run on a machine with an NVIDIA GPU, one JSON report.

Phases, in order, each under its own budget (docs/gpu-check.md): setup, build (a CUDA
`llama-server` from the carried llama.cpp tree, while numpy writes the GGUF), gguf, telemetry,
load, eviction, release, kill, sleep (sleeping.py). The report `$OUT/gpu-check.json` is rewritten after every
phase and check; logs sit beside it. `run.sh` starts this; `cargo xtask gpu-check --dry-run`
runs it against the fake NVML and a CPU `llama-server` (GPU_CHECK_MODE=dry_run).

Environment: OUT (report folder), GPU_CHECK_MODE (device | dry_run), GPU_CHECK_WORK (work
folder, /tmp/hangar-gpu-check; emptied but for the CMake tree), GPU_CHECK_DEADLINE_S (the whole run), GPU_CHECK_LLAMA_SERVER (a built binary: the
build phase then only unpacks and configures, for the CPU), GPU_CHECK_GGUF_ARGS (sizes for
gguf.py), GPU_CHECK_CUDA_FA (ON compiles the FlashAttention kernels; OFF by default),
GPU_CHECK_CHILD_PASS_ENV (variables hangard passes on to its engine children),
GPU_CHECK_LIBS (where hangard finds llama.cpp's shared libraries; the build tree's `bin`).
"""
import os
import shlex
import shutil
import subprocess
import sys
import time

from phases import Ctx, PHASES, cleanup
from sleeping import PHASE as SLEEP
from support import Report, log, trim_logs

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    out = os.path.abspath(os.environ.get("OUT") or os.path.join(HERE, "out"))
    os.makedirs(out, exist_ok=True)
    mode = os.environ.get("GPU_CHECK_MODE", "device")
    # Outside the carried folder, which a second call replaces: a second try on the same
    # machine finds the CMake tree of the first and builds nothing again.
    work = os.path.abspath(os.environ.get("GPU_CHECK_WORK") or "/tmp/hangar-gpu-check")
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        if name != "build":
            path = os.path.join(work, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    # The carried hangard links llama.cpp's shared libraries: the build phase's, with CUDA
    # (GPU_CHECK_LIBS names others). A statically linked hangard ignores this.
    libs = os.environ.get("GPU_CHECK_LIBS") or os.path.join(work, "build", "bin")
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libs, os.environ.get("LD_LIBRARY_PATH")) if p)
    report = Report(os.path.join(out, "gpu-check.json"), mode,
                    float(os.environ.get("GPU_CHECK_DEADLINE_S", "460")))
    ctx = Ctx(report=report, mode=mode, bundle=HERE, work=work, out=out)
    report.data["machine"] = {"cores": os.cpu_count(), "python": sys.version.split()[0],
                              "bundle": HERE}
    # numpy writes the GGUF while the build compiles (one core and the disk against many).
    gguf_args = shlex.split(os.environ.get("GPU_CHECK_GGUF_ARGS", ""))
    ctx.gguf_path = os.path.join(work, "random-llama.gguf")
    ctx.gguf_started = time.monotonic()
    ctx.gguf_proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "gguf.py"), ctx.gguf_path, *gguf_args],
        stdout=subprocess.PIPE, stderr=open(os.path.join(out, "gguf.log"), "w"), text=True)
    try:
        for name, budget, body in [*PHASES, SLEEP]:
            report.run_phase(name, budget[mode], lambda deadline, body=body: body(ctx, deadline))
    finally:
        cleanup(ctx)
        trim_logs(out)
        report.data["finished"] = True
        report.save()
    failed = [c["name"] for c in report.data["checks"] if not c["ok"]]
    bad = [f"{p['name']} ({p['status']})" for p in report.data["phases"] if p["status"] != "ok"]
    log(f"report: {report.path}")
    log(f"{'PASS' if report.data['ok'] else 'FAIL'}: {len(report.data['checks'])} checks, "
        f"failed: {failed or 'none'}; phases not ok: {bad or 'none'}; "
        f"{report.data['total_s']:.0f}s in all")
    return 0 if report.data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
