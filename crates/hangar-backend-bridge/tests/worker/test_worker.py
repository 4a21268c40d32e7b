"""A bridge worker with no engine, for testing Hangar's side of the protocol (PROTOCOL.md).

Standard library only. Its engine "echo" streams the prompt back word by word; the
environment variable HANGAR_TEST_WORKER picks a misbehaviour:

  ok (default)       follow the protocol
  version            answer hello with protocol version 99
  garbage_hello      write a line that is not JSON instead of hello
  garbage_generate   write a line that is not JSON when asked to generate
  hang_hello         never answer hello
  hang_after_load    stop reading (and answering pings) once loaded
  die_generate       exit with status 7 in the middle of a generation
  load_error         fail every load with load_failed
  missing            --check reports the package `enginepkg` missing
  unknown_id         answer a generation under an id Hangar never sent
  wrong_reply        answer a generation with pong
  refuse             answer a generation with a `protocol` error

HANGAR_TEST_TICKS=N makes a generation of the prompt "tick" stream N "tick" tokens, one per
HANGAR_TEST_TOKEN_MS milliseconds (default 0), so tests can cancel one in flight.
"""

import json
import os
import socket
import sys
import threading
import time

PROTOCOL = 1
MODE = os.environ.get("HANGAR_TEST_WORKER", "ok")
TOKEN_S = int(os.environ.get("HANGAR_TEST_TOKEN_MS", "0")) / 1000.0

lock = threading.Lock()
cancelled = {}


def log(line):
    print(line, file=sys.stderr, flush=True)


def send(sock, message):
    with lock:
        sock.sendall((json.dumps(message) + "\n").encode())


def words(request):
    prompt = request.get("prompt")
    if prompt is None:
        prompt = json.dumps({"messages": request.get("messages"), "thinking": request.get("thinking")})
    if prompt.strip() == "tick":
        return ["tick "] * int(os.environ.get("HANGAR_TEST_TICKS", "1000000"))
    return [w + " " for w in prompt.split()]


def generate(sock, rid, request):
    if MODE == "garbage_generate":
        with lock:
            sock.sendall(b"Traceback (most recent call last): oops\n")
        return
    if MODE == "unknown_id":
        send(sock, {"id": 999, "type": "token", "text": "x"})
        return
    if MODE == "wrong_reply":
        send(sock, {"id": rid, "type": "pong"})
        return
    if MODE == "refuse":
        send(sock, {"id": rid, "type": "error", "code": "protocol", "message": "what is this?"})
        return
    params = request.get("params") or {}
    limit = params.get("max_tokens")
    stops = params.get("stop") or []
    flag = cancelled.setdefault(rid, threading.Event())
    out, n, met = "", 0, None
    tokens = words(request)
    for i, token in enumerate(tokens):
        if flag.is_set():
            log(f"cancelled request {rid}")
            send(sock, {"id": rid, "type": "error", "code": "cancelled", "message": "cancelled"})
            return
        if limit is not None and n >= limit:
            send(sock, {"id": rid, "type": "done", "finish_reason": "length",
                        "prompt_tokens": len(tokens), "completion_tokens": n})
            return
        if MODE == "die_generate" and i == 2:
            log("dying on purpose")
            os._exit(7)
        out += token
        met = next((k for k, s in enumerate(stops) if s in out), None)
        if met is not None:
            break
        send(sock, {"id": rid, "type": "token", "text": token})
        n += 1
        if TOKEN_S:
            time.sleep(TOKEN_S)
    send(sock, {"id": rid, "type": "done", "finish_reason": "stop",
                "prompt_tokens": len(tokens), "completion_tokens": n, "stop_sequence": met})


def main():
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        if MODE == "missing":
            print(json.dumps({"code": "missing_package", "package": "enginepkg", "python": sys.executable,
                              "message": f"the Python package `enginepkg` is not installed for {sys.executable}"}))
            sys.exit(3)
        print(json.dumps({"ok": True}))
        return
    path = args[args.index("--socket") + 1]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    log(f"test worker connected, mode {MODE}")
    reader = sock.makefile("r", encoding="utf-8")
    loaded = False
    for line in reader:
        request = json.loads(line)
        rid, op = request["id"], request["op"]
        if op == "hello":
            if MODE == "hang_hello":
                time.sleep(3600)
            if MODE == "garbage_hello":
                with lock:
                    sock.sendall(b"hello there\n")
                continue
            send(sock, {"id": rid, "type": "hello", "protocol": 99 if MODE == "version" else PROTOCOL,
                        "worker": "test-worker", "worker_version": "0", "python": sys.version.split()[0],
                        "engines": ["echo"]})
        elif op == "load":
            if MODE == "load_error":
                send(sock, {"id": rid, "type": "error", "code": "load_failed",
                            "message": "simulated: out of memory"})
                continue
            loaded = True
            model = request["model"]
            send(sock, {"id": rid, "type": "loaded", "max_parallel_sequences": 4,
                        "details": {"engine": "echo", "engine_asked": request["engine"],
                                    "settings": model["settings"], "device": model["device"]}})
            if MODE == "hang_after_load":
                log("hanging now")
                time.sleep(3600)
        elif op == "generate":
            threading.Thread(target=generate, args=(sock, rid, request), daemon=True).start()
        elif op == "count":
            send(sock, {"id": rid, "type": "counted", "prompt_tokens": len(words(request))})
        elif op == "embed":
            vectors = [[1.0, 0.0] if len(t) % 2 else [0.0, 1.0] for t in request["inputs"]]
            send(sock, {"id": rid, "type": "embeddings", "vectors": vectors,
                        "prompt_tokens": sum(len(t.split()) for t in request["inputs"])})
        elif op == "rerank":
            query = set(request["query"].split())
            scores = [float(len(query & set(d.split()))) for d in request["documents"]]
            send(sock, {"id": rid, "type": "rerankings", "scores": scores, "prompt_tokens": len(scores)})
        elif op == "cancel":
            cancelled.setdefault(request["target"], threading.Event()).set()
            send(sock, {"id": rid, "type": "ok"})
        elif op == "ping":
            send(sock, {"id": rid, "type": "pong"})
        elif op == "unload":
            loaded = False
            log("unloaded")
            send(sock, {"id": rid, "type": "ok"})
        elif op == "shutdown":
            send(sock, {"id": rid, "type": "ok"})
            log(f"shutting down (loaded: {loaded})")
            return
        else:
            send(sock, {"id": rid, "type": "error", "code": "protocol", "message": f"unknown op {op}"})


if __name__ == "__main__":
    main()
