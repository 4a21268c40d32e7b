"""The dry run's pretend driver: keeps the fake NVML's script (crates/hangar-gpu/tests/fake)
true to a registry of processes holding GPU memory.

A pretend engine writes its pid and MiB into the registry folder (a file named after the
pid); every 50 ms this rewrites the script: GPU 0's used memory is the base plus what the
live registered processes hold, one `proc` line each. A process that died (or is a zombie)
is dropped, as a real driver frees a dead process's memory.

    python3 fake_gpu.py SCRIPT REGISTRY BASE_MIB TOTAL_MIB NAME...
"""
import os
import sys
import time


def alive(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return False


def main(script, registry, base, total, *name):
    base, total, name = int(base), int(total), " ".join(name)
    os.makedirs(registry, exist_ok=True)
    while True:
        procs = []
        for entry in os.listdir(registry):
            if not entry.isdigit():
                continue
            path = os.path.join(registry, entry)
            if not alive(int(entry)):
                os.remove(path)
                continue
            try:
                procs.append((int(entry), int(open(path).read())))
            except (OSError, ValueError):
                pass
        used = base + sum(mib for _, mib in procs)
        lines = [f"gpu 0 {used} {total} {name}"] + [f"proc 0 {pid} {mib}" for pid, mib in sorted(procs)]
        tmp = f"{script}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, script)
        time.sleep(0.05)


if __name__ == "__main__":
    main(*sys.argv[1:])
