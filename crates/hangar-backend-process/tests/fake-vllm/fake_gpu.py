"""The fake `vllm serve`'s pretend GPU: the script of the fake NVML library
(crates/hangar-gpu/tests/fake), which re-reads it on every call. See README.md ("A pretend
GPU")."""

import json
import os
import sys

GPU = {}


def placed_gpus():
    """The GPUs CUDA_VISIBLE_DEVICES names (indices, in PCI bus order); GPU 0 without one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpus = [int(g) for g in visible.split(",") if g.strip().isdigit()]
    return gpus or [0]


def nvml_edit(deltas, add=(), remove_pid=None):
    """Changes the used memory of each GPU in `deltas` ({index: MiB}) and the process lines
    in the script, atomically."""
    import fcntl
    path = os.environ["FAKE_VLLM_NVML_SCRIPT"]
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as f:
            lines = f.read().splitlines()
        out = []
        for line in lines:
            parts = line.split()
            if parts[:1] == ["gpu"] and int(parts[1]) in deltas:
                parts[2] = str(max(0, int(parts[2]) + deltas[int(parts[1])]))
                line = " ".join(parts)
            if parts[:1] == ["proc"] and remove_pid is not None and parts[2] == str(remove_pid):
                continue
            out.append(line)
        out.extend(add)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(out) + "\n")
        os.replace(tmp, path)


def take_gpu(name, vlog):
    """Starts the "engine core" child that holds the model's memory, split evenly over the
    GPUs its CUDA_VISIBLE_DEVICES names (GPU 0 without one), or as a list of MiB gives it
    (the i-th entry on the i-th GPU)."""
    footprints = json.loads(os.environ.get("FAKE_VLLM_GPU_MIB") or "{}")
    mib = footprints.get(name)
    if not mib or not os.environ.get("FAKE_VLLM_NVML_SCRIPT"):
        return
    import subprocess
    # The core dies with its parent (as a process whose parent was SIGKILLed should), so a
    # test that kills hangard and with it this fake leaves nothing behind.
    # A parent that died before the prctl took effect sent no signal: the core checks.
    core = subprocess.Popen([sys.executable, "-c", "import ctypes, os, signal, sys, time\n"
                             "ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
                             "if os.getppid() != int(sys.argv[1]): sys.exit(0)\n"
                             "while True: time.sleep(3600)", str(os.getpid())])
    try:
        overhead = int(os.environ.get("FAKE_VLLM_GPU_OVERHEAD_MIB") or 0)
    except ValueError:
        overhead = 0
    gpus = placed_gpus()
    if isinstance(mib, list):
        shares = {g: mib[i % len(mib)] for i, g in enumerate(gpus)}
        mib = sum(shares.values())
    else:
        shares = {g: -(-mib // len(gpus)) for g in gpus}
    deltas = {g: shares[g] + overhead for g in gpus}
    nvml_edit(deltas, add=[f"proc {g} {core.pid} {shares[g]}" for g in gpus])
    GPU.update(core=core, deltas=deltas, shares=shares)
    on = ",".join(map(str, gpus))
    vlog("INFO", f"EngineCore pid {core.pid} holds {mib} MiB on GPU {on} (fake)", where="core.py:1")


def give_gpu_back():
    """Sleep: the engine core gives the model's memory back and stays alive."""
    if GPU:
        shares = GPU["shares"]
        nvml_edit({g: -m for g, m in shares.items()}, remove_pid=GPU["core"].pid,
                  add=[f"proc {g} {GPU['core'].pid} 0" for g in shares])
        GPU["deltas"] = {g: d - shares[g] for g, d in GPU["deltas"].items()}


def take_gpu_again():
    """Wake: the engine core takes the model's memory back."""
    if GPU:
        shares = GPU["shares"]
        nvml_edit(dict(shares), remove_pid=GPU["core"].pid,
                  add=[f"proc {g} {GPU['core'].pid} {m}" for g, m in shares.items()])
        GPU["deltas"] = {g: d + shares[g] for g, d in GPU["deltas"].items()}


def give_gpu():
    if GPU:
        nvml_edit({g: -d for g, d in GPU["deltas"].items()}, remove_pid=GPU["core"].pid)
        GPU["core"].kill()
        GPU.clear()
