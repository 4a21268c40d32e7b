"""What the GPU check's phases share: the report, deadlines, `nvidia-smi`, `hangard` and HTTP.

Standard library only (the device has Python 3.12 with numpy, nothing of Hangar's).
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

MIB = 1 << 20
LISTENING = "hangard listening on "


class PhaseTimeout(Exception):
    """A phase ran past its budget (raised by the phase's alarm or by a deadline check)."""


def log(msg):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Report:
    """The one JSON report, rewritten atomically after every phase and check, so a run cut
    short still leaves what it measured."""

    def __init__(self, path, mode, deadline_s):
        self.path = path
        self.started = time.monotonic()
        self.deadline = self.started + deadline_s
        self.data = {
            "schema": 1, "mode": mode, "ok": False, "finished": False,
            "started_unix": int(time.time()), "total_s": 0.0, "deadline_s": deadline_s,
            "machine": {}, "phases": [], "checks": [], "figures": {},
        }
        self.children = []  # processes to kill when a phase is cut short
        self.save()

    def left(self):
        return self.deadline - time.monotonic()

    def figures(self, phase):
        return self.data["figures"].setdefault(phase, {})

    def check(self, name, phase, ok, detail):
        """One verdict; `detail` says what was compared."""
        self.data["checks"].append({"name": name, "phase": phase, "ok": bool(ok), "detail": detail})
        log(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        self.save()
        return ok

    def run_phase(self, name, budget_s, body):
        """Runs `body(deadline)` under its own budget (cut to what is left of the whole run);
        records status (ok, failed, timed_out, skipped), seconds and error."""
        budget = min(budget_s, self.left() - 5)
        entry = {"name": name, "budget_s": budget_s, "granted_s": round(max(budget, 0), 1),
                 "status": "skipped", "seconds": 0.0, "error": None}
        self.data["phases"].append(entry)
        if budget < 5:
            entry["error"] = "no time left in the run"
            log(f"phase {name}: skipped, no time left")
            self.save()
            return False
        log(f"phase {name}: budget {budget:.0f}s")
        started = time.monotonic()
        deadline = started + budget

        def alarm(_signum, _frame):
            raise PhaseTimeout(f"phase {name} ran past {budget:.0f}s")

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, budget + 2)
        try:
            body(deadline)
            entry["status"] = "ok"
        except PhaseTimeout as e:
            entry["status"], entry["error"] = "timed_out", str(e)
        except Exception as e:  # noqa: BLE001 - every failure is a report entry
            entry["status"], entry["error"] = "failed", f"{type(e).__name__}: {e}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            entry["seconds"] = round(time.monotonic() - started, 2)
        if entry["status"] != "ok":
            log(f"phase {name}: {entry['status']}: {entry['error']}")
        self.save()
        return entry["status"] == "ok"

    def save(self):
        self.data["total_s"] = round(time.monotonic() - self.started, 2)
        self.data["ok"] = (bool(self.data["checks"]) and all(c["ok"] for c in self.data["checks"])
                           and all(p["status"] == "ok" for p in self.data["phases"]))
        tmp = self.path + ".part"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2)
            f.write("\n")
        os.replace(tmp, self.path)


def left(deadline, floor=1.0):
    """Seconds until `deadline`; PhaseTimeout when fewer than `floor` are left."""
    rest = deadline - time.monotonic()
    if rest < floor:
        raise PhaseTimeout("deadline reached")
    return rest


def run(cmd, deadline, log_file=None, **kw):
    """Runs `cmd` to its end before `deadline` (killed, then PhaseTimeout, if not); its
    output appended to `log_file` or captured; the completed process."""
    out = open(log_file, "a") if log_file else subprocess.PIPE
    try:
        if log_file:
            out.write(f"$ {' '.join(map(str, cmd))}\n")
            out.flush()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log_file else subprocess.PIPE,
                             text=True, start_new_session=True, **kw)
        try:
            stdout, stderr = p.communicate(timeout=left(deadline))
        except (subprocess.TimeoutExpired, PhaseTimeout):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise PhaseTimeout(f"{cmd[0]} still running at the phase's deadline") from None
        return subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    finally:
        if log_file:
            out.close()


# -- nvidia-smi -------------------------------------------------------------------------------

def smi(args, deadline):
    p = run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], deadline)
    if p.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return [[c.strip() for c in line.split(",")] for line in p.stdout.splitlines() if line.strip()]


def smi_gpu(deadline):
    """GPU 0 as `nvidia-smi` sees it: name, memory (MiB), compute capability, driver."""
    row = smi(["--query-gpu=index,name,memory.total,memory.used,compute_cap,driver_version"],
              deadline)[0]
    gpu = {"index": int(row[0]), "name": row[1], "total_mib": int(row[2]),
           "used_mib": int(row[3]), "compute_cap": row[4], "driver": row[5]}
    try:  # Not every driver knows the field.
        gpu["reserved_mib"] = int(smi(["--query-gpu=memory.reserved"], deadline)[0][0])
    except (RuntimeError, ValueError, IndexError):
        gpu["reserved_mib"] = None
    return gpu


def smi_apps(deadline):
    """{pid: used MiB} of the compute processes `nvidia-smi` lists."""
    apps = {}
    for row in smi(["--query-compute-apps=pid,used_memory"], deadline):
        try:
            apps[int(row[0])] = int(row[1])
        except ValueError:
            apps[int(row[0])] = None  # "[N/A]" where the driver does not say
    return apps


# -- processes ----------------------------------------------------------------------------------

def descendants(root):
    """Every live descendant of `root`, from /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
                parents[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return sorted(found)


# -- hangard --------------------------------------------------------------------------------------

class Hangard:
    """`hangard serve` on a free loopback port, its stderr (and stdout once it listens) in
    `log_path`."""

    def __init__(self, binary, config_dir, log_path, deadline, env=None):
        self.log = open(log_path, "a")
        cmd = [binary, "serve", "--config", config_dir, "--port", "0", "--grpc-port", "0"]
        self.log.write(f"$ {' '.join(cmd)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**os.environ, "RUST_LOG": "info", **(env or {})})
        lines = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                lines.put(line)
                try:
                    self.log.write(line)
                    self.log.flush()
                except ValueError:  # closed by stop(): the rest is not needed
                    pass
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=left(deadline))
            except queue.Empty:
                raise PhaseTimeout("hangard did not listen before the deadline") from None
            if line is None:
                raise RuntimeError(f"hangard exited ({self.proc.wait()}) before listening; see {log_path}")
            if line.startswith(LISTENING):
                self.base = line[len(LISTENING):].strip()
                break

    @property
    def pid(self):
        return self.proc.pid

    def request(self, method, path, deadline, body=None):
        """(status, JSON body or text) of one request."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=left(deadline)) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path, deadline):
        return self.request("GET", path, deadline)

    def post(self, path, deadline, body=None):
        return self.request("POST", path, deadline, {} if body is None else body)

    def row(self, model, deadline):
        status, row = self.get(f"/v1/admin/models/{model}", deadline)
        if status != 200:
            raise RuntimeError(f"GET /v1/admin/models/{model}: {status} {row}")
        return row

    def stop(self, deadline):
        """SIGTERM, then SIGKILL at the deadline; the exit status (again when stopped)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return code

    def kill9(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        code = self.proc.wait()
        self.log.close()
        return code


def trim_logs(out, limit=15 * MIB):
    """Keeps the last `limit` bytes of every file in `out` (the device brings back 16 MiB
    a file at most)."""
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if os.path.isfile(path) and os.path.getsize(path) > limit:
            with open(path, "rb") as f:
                f.seek(-limit, os.SEEK_END)
                tail = f.read()
            with open(path, "wb") as f:
                f.write(b"[... cut to the last 15 MiB ...]\n" + tail)


def write_config(directory, settings):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "settings.json"), "w") as f:
        json.dump(settings, f, indent=2)


def metric(text, name, labels):
    """The value of `name{labels}` in Prometheus text, or None."""
    prefix = f"{name}{{{labels}}} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


def poll(deadline, what, interval=0.1):
    """Calls `what()` until it answers truthy; (answer, seconds); PhaseTimeout at the deadline."""
    started = time.monotonic()
    while True:
        answer = what()
        if answer:
            return answer, round(time.monotonic() - started, 2)
        left(deadline, floor=interval)
        time.sleep(interval)
