"""Three Hangar hosts behind a real router: requests reach a host that serves their model, and
when one host is killed every request still ends answered or explicitly refused.

Each host is a `hangard` in a network namespace of its own, reached over a veth pair from the
router's namespace (all made by this run and removed after it: nothing leaves the machine).
The hosts listen beyond loopback, so each runs with an admin key. They serve the trained
models of the fixtures:

    host 1: smollm2 (chat), minilm (embeddings)
    host 2: smollm2
    host 3: minilm

The router is `vllm-router` (PyPI) in its multi-model mode (`--enable-igw`), round robin per
model. It keys workers by URL, so host 1 has one address per model it serves and the router
one registration per model per host (`POST /workers`). Hangar's /healthz is its health check.

1. Routing: chat requests and embeddings through the router, each answered; every host's
   own counters say which models it answered, and they must be models it serves, the
   router having spread each model over both of its hosts. Each host's /metrics/node lists
   the models it serves as the picker of the Inference Extension reads them.
2. A host killed: clients keep sending chat requests; host 2 is killed (SIGKILL) while they
   run. Every request must end answered (200 and a whole body) or explicitly refused (an
   HTTP error with a body): none hangs or ends cut. The counts are printed. Once the router
   has seen host 2 fail, a last batch is answered in full, by host 1.

Needs root (namespaces): without it, or without `ip`, it prints SKIPPED and exits 77.
Environment: HANGARD (the binary), HANGAR_TRAINED_MODELS (the fixtures' models folder),
VLLM_ROUTER (default: `vllm-router` beside this Python), HANGAR_E2E_LOGS (where the logs go).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = f"hg{os.getpid() % 100000}"
ROUTER_NS = f"{RUN}r"
PORT = 8080
ROUTER = "http://127.0.0.1:30080"
KEY = os.urandom(16).hex()
# host -> (models, one address per model)
HOSTS = {
    1: {"smollm2": "10.99.1.2", "minilm": "10.99.1.3"},
    2: {"smollm2": "10.99.2.2"},
    3: {"minilm": "10.99.3.2"},
}
SKIPPED = 77
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0}


def sh(*args, check=True):
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def ns(host):
    return f"{RUN}h{host}"


def make_network():
    sh("ip", "netns", "add", ROUTER_NS)
    sh("ip", "-n", ROUTER_NS, "link", "set", "lo", "up")
    for host, models in HOSTS.items():
        sh("ip", "netns", "add", ns(host))
        near, far = f"{RUN}a{host}", f"{RUN}b{host}"
        sh("ip", "link", "add", near, "netns", ROUTER_NS, "type", "veth",
           "peer", "name", far, "netns", ns(host))
        sh("ip", "-n", ROUTER_NS, "addr", "add", f"10.99.{host}.1/24", "dev", near)
        sh("ip", "-n", ROUTER_NS, "link", "set", near, "up")
        for address in models.values():
            sh("ip", "-n", ns(host), "addr", "add", f"{address}/24", "dev", far)
        sh("ip", "-n", ns(host), "link", "set", far, "up")
        sh("ip", "-n", ns(host), "link", "set", "lo", "up")


def remove_network():
    for name in [ROUTER_NS] + [ns(h) for h in HOSTS]:
        pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        sh("ip", "netns", "del", name, check=False)


def outer():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("SKIPPED: the multi-host test needs root and iproute2 to make network namespaces")
        return SKIPPED
    try:
        make_network()
    except RuntimeError as e:
        remove_network()
        print(f"SKIPPED: network namespaces cannot be made here: {e}")
        return SKIPPED
    try:
        inner = ["ip", "netns", "exec", ROUTER_NS, sys.executable, __file__, "--inside", RUN]
        return subprocess.run(inner).returncode
    finally:
        remove_network()


# ---- inside the router's namespace ----


def request(method, url, body=None, key=None, timeout=60):
    """(status, parsed body or text); raises on a connection that ends without an answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def start_host(host, models_dir, logs):
    config = Path(tempfile.mkdtemp(prefix=f"hangar-{ns(host)}-"))
    paths = {
        "smollm2": {"backend": "llama_cpp", "prompt_format": "auto", "gguf_n_ctx": 1024,
                    "model_path": str(models_dir / "SmolLM2-135M-Instruct.Q4_1.gguf")},
        "minilm": {"backend": "llama_cpp", "labels": ["embedding"],
                   "model_path": str(models_dir / "all-MiniLM-L6-v2.F32.gguf")},
    }
    models = {m: dict(paths[m], enabled=True) for m in HOSTS[host]}
    settings = {"host": "0.0.0.0", "port": PORT, "grpc_port": 0, "auto_load": False,
                "max_loaded_models": {"llm": 1, "embedding": 1}, "models": models}
    (config / "settings.json").write_text(json.dumps(settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
    log = open(logs / f"multi-host-{host}.log", "w")
    binary = os.environ["HANGARD"]
    args = ["ip", "netns", "exec", ns(host), binary, "serve", "--config", str(config),
            "--admin-api-key", KEY]
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url, limit=120):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if request("GET", url + "/readyz", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {limit}s")


def wait_healthy(expected, limit=60):
    """Until the router counts `expected` healthy workers (it checks a new one first)."""
    deadline = time.monotonic() + limit
    while True:
        status, body = request("GET", ROUTER + "/workers", timeout=5)
        healthy = body.get("stats", {}).get("healthy_workers") if status == 200 else None
        if healthy == expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router has {healthy} healthy workers of {expected}: {body}")
        time.sleep(0.3)


def answered(status, body, model):
    """Whether a response is a whole answer for `model`."""
    if status != 200 or not isinstance(body, dict):
        return False
    if "choices" in body:
        return body["model"] == model and body["choices"][0]["message"]["content"] != ""
    return len(body.get("data", [{}])[0].get("embedding", [])) == 384


def ask(model):
    """One request for `model` through the router: ("answered" | "refused" | "lost", detail)."""
    if model == "minilm":
        path, body = "/v1/embeddings", {"model": model, "input": "Paris is in France."}
    else:
        path, body = "/v1/chat/completions", dict(CHAT, model=model)
    try:
        status, reply = request("POST", ROUTER + path, body, timeout=60)
    except (OSError, ValueError) as e:
        return "lost", f"{type(e).__name__}: {e}"
    if answered(status, reply, model):
        return "answered", status
    if status >= 400 and reply:
        return "refused", f"{status} {str(reply)[:160]}"
    return "lost", f"{status} {str(reply)[:160]}"


def counts_by_model(url):
    """{model: answered requests} from a host's own /metrics."""
    status, text = request("GET", url + "/metrics", key=KEY)
    assert status == 200, (url, status)
    out = {}
    for line in text.splitlines():
        m = re.match(r'hangar_requests_total\{[^}]*model="([^"]+)",outcome="ok"\} (\S+)', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(float(m.group(2)))
    return out


def node_adapters(url):
    status, text = request("GET", url + "/metrics/node", key=KEY)
    assert status == 200, (url, status)
    m = re.search(r'vllm:lora_requests_info\{[^}]*running_lora_adapters="([^"]*)"', text)
    assert m, text
    return set(filter(None, m.group(1).split(",")))


def in_parallel(jobs, threads):
    results, lock, queue = [], threading.Lock(), list(jobs)

    def work():
        while True:
            with lock:
                if not queue:
                    return
                model = queue.pop()
            outcome = ask(model)
            with lock:
                results.append((model, outcome))

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


def host_url(host):
    return f"http://{next(iter(HOSTS[host].values()))}:{PORT}"


def routing_phase():
    print("== 1. routing: each model reaches a host that serves it")
    # One model at a time: the router's round-robin counter is shared by its models.
    results = in_parallel(["smollm2"] * 12, threads=4) + in_parallel(["minilm"] * 12, threads=4)
    bad = [(m, o) for m, o in results if o[0] != "answered"]
    assert not bad, f"requests not answered: {bad}"
    print(f"ok: {len(results)} requests answered through the router")
    for host, models in HOSTS.items():
        counts = counts_by_model(host_url(host))
        print(f"   host {host} answered {counts} (serves {sorted(models)})")
        assert set(counts) <= set(models), f"host {host} answered models it does not serve"
        for model in models:
            assert counts.get(model, 0) > 0, f"the router never sent {model} to host {host}"
        adapters = node_adapters(host_url(host))
        assert adapters == set(models), (host, adapters)
    total = {m: sum(counts_by_model(host_url(h)).get(m, 0) for h in HOSTS) for m in ("smollm2", "minilm")}
    assert total == {"smollm2": 12, "minilm": 12}, total
    print("ok: every host answered only its own models, each model spread over its two hosts")
    print("ok: each host's /metrics/node lists exactly the models it serves")
    kind, detail = ask("no-such-model")
    assert kind == "refused", (kind, detail)
    print(f"ok: a model no host serves is refused: {detail}")


def failover_phase(victim):
    print("== 2. a host killed while clients send")
    outcomes, lock, stop = [], threading.Lock(), threading.Event()

    def client():
        while not stop.is_set():
            outcome = ask("smollm2")
            with lock:
                outcomes.append(outcome)

    clients = [threading.Thread(target=client) for _ in range(3)]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 60
    while len(outcomes) < 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    before = len(outcomes)
    assert before >= 6, f"only {before} requests ended in 60 s before the kill"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    print(f"   host 2 killed after {before} requests")
    time.sleep(8)
    stop.set()
    for t in clients:
        t.join()
    tally = {k: sum(1 for o in outcomes if o[0] == k) for k in ("answered", "refused", "lost")}
    print(f"   while host 2 died: {len(outcomes)} requests: {tally}")
    for kind, detail in outcomes:
        if kind != "answered":
            print(f"   {kind}: {detail}")
    assert tally["lost"] == 0, "a request ended neither answered nor refused"
    assert tally["answered"] > before, "nothing was answered after host 2 died"

    start = counts_by_model(host_url(1)).get("smollm2", 0)
    last = in_parallel(["smollm2"] * 10, threads=3)
    last_tally = {k: sum(1 for _, o in last if o[0] == k) for k in ("answered", "refused", "lost")}
    print(f"   after the router saw host 2 fail: {last_tally}")
    assert last_tally["answered"] == 10, last
    grew = counts_by_model(host_url(1)).get("smollm2", 0) - start
    assert grew == 10, f"host 1 answered {grew} of the last 10"
    print("ok: every request ended answered or refused; the last 10 all answered by host 1")
    return tally


def inside():
    logs = Path(os.environ.get("HANGAR_E2E_LOGS", tempfile.gettempdir()))
    models_dir = Path(os.environ["HANGAR_TRAINED_MODELS"])
    router_bin = os.environ.get("VLLM_ROUTER", str(Path(sys.executable).with_name("vllm-router")))
    hosts = {h: start_host(h, models_dir, logs) for h in HOSTS}
    router = None
    try:
        for host in HOSTS:
            wait_ready(host_url(host))
        router_log = open(logs / "multi-host-router.log", "w")
        router = subprocess.Popen(
            [router_bin, "--host", "127.0.0.1", "--port", "30080", "--enable-igw",
             "--policy", "round_robin", "--health-check-endpoint", "/healthz",
             "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
             "--prometheus-port", "29080", "--log-level", "info"],
            stdout=router_log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if request("GET", ROUTER + "/workers", timeout=5)[0] == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)
        for host, models in HOSTS.items():
            for model, address in models.items():
                status, body = request("POST", ROUTER + "/workers",
                                       {"url": f"http://{address}:{PORT}", "model_id": model})
                assert status < 300 and body.get("success"), (status, body)
        wait_healthy(sum(len(m) for m in HOSTS.values()))
        print(f"router on {ROUTER}: {sum(len(m) for m in HOSTS.values())} registrations")
        routing_phase()
        failover_phase(hosts[2])
        return 0
    except (AssertionError, RuntimeError) as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        for process in list(hosts.values()) + ([router] if router else []):
            if process.poll() is None:
                process.terminate()
        for process in list(hosts.values()) + ([router] if router else []):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inside":
        RUN = sys.argv[2]
        ROUTER_NS = f"{RUN}r"
        sys.exit(inside())
    sys.exit(outer())
