"""`python -u -m hangar_bridge --socket PATH`: the bridge worker's session (PROTOCOL.md).

`python -m hangar_bridge --check ENGINE` prints one JSON line saying whether the engine's
packages are findable (without importing them): exit 0 when they are, 3 when not.

The main thread reads requests and answers the quick ones (hello, ping, cancel); load,
generate, embed, rerank, sleep, wake and unload each run on their own thread, so `ping` is
answered at once. `sleep` and `wake` go to the adapter's methods of those names; an adapter
without them (its engine cannot sleep) answers `unsupported`. Every write to the socket
holds one lock. The worker exits when the connection ends, after answering `shutdown`, and
on SIGTERM.
"""

import argparse
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time

from . import ENGINES, BridgeError, __version__, find_missing, log, missing_package

PROTOCOL_VERSION = 1


def adapter_module(engine):
    """The adapter module of `engine` (standard library only at import time)."""
    if engine not in ENGINES:
        raise BridgeError(
            "unknown_engine",
            f"no adapter for engine {engine!r}; this worker has {', '.join(sorted(ENGINES))}",
        )
    return importlib.import_module(f"{__package__}.{ENGINES[engine]}")


def check(engine):
    """`--check ENGINE`: one JSON line; 0 when every package is findable, else 3."""
    try:
        packages = adapter_module(engine).PACKAGES
        missing = find_missing(packages)
        if missing is not None:
            raise missing_package(missing)
    except BridgeError as e:
        print(json.dumps(e.reply()))
        return 3
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in packages:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    ok = {"ok": True, "engine": engine, "python": sys.executable, "packages": versions}
    print(json.dumps(ok))
    return 0


class Session:
    def __init__(self, sock):
        self.sock = sock
        self.write_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.greeted = False
        self.adapter = None
        self.engine = None
        self.loading = False
        self.running = {}  # generate id -> cancel Event

    # -- writing
    def send(self, message):
        data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8")
        with self.write_lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                log(f"the connection failed while writing: {e}")
                os._exit(0)

    def reply(self, rid, kind, **fields):
        self.send({"id": rid, "type": kind, **fields})

    def fail(self, rid, error):
        self.send({"id": rid, **error.reply()})

    # -- reading
    def serve(self):
        reader = self.sock.makefile("rb")
        for line in reader:
            if line.strip():
                self.handle(line)
        log("the connection closed; exiting")

    def handle(self, line):
        try:
            request = json.loads(line)
        except ValueError as e:
            self.fail(None, BridgeError("protocol", f"not a JSON line: {e}"))
            return
        rid = request.get("id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or not isinstance(rid, int) or isinstance(rid, bool):
            self.fail(rid, BridgeError("protocol", "a request is an object with an integer id"))
            return
        op = request.get("op")
        if op == "hello":
            self.greeted = True
            self.reply(
                rid,
                "hello",
                protocol=PROTOCOL_VERSION,
                worker="hangar_bridge",
                worker_version=__version__,
                python=sys.version.split()[0],
                engines=sorted(ENGINES),
            )
        elif not self.greeted:
            self.fail(rid, BridgeError("protocol", f"{op!r} before hello"))
        elif op == "ping":
            self.reply(rid, "pong")
        elif op == "cancel":
            event = self.running.get(request.get("target"))
            if event is not None:
                event.set()
            self.reply(rid, "ok")
        elif op == "shutdown":
            self.reply(rid, "ok")
            log("shutdown")
            with self.write_lock:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                os._exit(0)
        elif op in ("load", "generate", "count", "embed", "rerank", "sleep", "wake", "unload"):
            self.start(rid, op, request)
        else:
            self.fail(rid, BridgeError("protocol", f"unknown op {op!r}"))

    def start(self, rid, op, request):
        if op == "generate":
            self.running[rid] = threading.Event()
        target = getattr(self, f"op_{op}")
        threading.Thread(target=self.run, args=(rid, op, target, request), daemon=True).start()

    def run(self, rid, op, target, request):
        try:
            target(rid, request)
        except BridgeError as e:
            if e.code == "cancelled":
                log(f"cancelled request {rid}")
            self.fail(rid, e)
        except Exception as e:  # noqa: BLE001 - the worker stays usable
            log(f"{op} {rid} failed: {type(e).__name__}: {e}")
            self.fail(rid, BridgeError("engine_error", f"{type(e).__name__}: {e}"))
        finally:
            self.running.pop(rid, None)

    def loaded(self):
        adapter = self.adapter
        if adapter is None:
            raise BridgeError("not_loaded", "no model is loaded")
        return adapter

    # -- the ops that run on their own thread
    def op_load(self, rid, request):
        with self.state_lock:
            if self.loading or self.adapter is not None:
                raise BridgeError("load_failed", "a model is already loaded or loading")
            self.loading = True
        try:
            engine = request.get("engine")
            model = request.get("model")
            if not isinstance(model, dict):
                raise BridgeError("protocol", "load needs a model object")
            adapter = adapter_module(engine).Adapter()
            log(f"loading {model.get('name')} ({engine}) from {model.get('model_path')}")
            try:
                max_parallel, details = adapter.load(model)
            except BridgeError:
                raise
            except Exception as e:  # noqa: BLE001 - an adapter bug or an engine surprise
                raise BridgeError("load_failed", f"{type(e).__name__}: {e}") from None
            self.adapter, self.engine = adapter, engine
        finally:
            self.loading = False
        self.reply(rid, "loaded", max_parallel_sequences=max_parallel, details=details)

    def op_generate(self, rid, request):
        adapter = self.loaded()
        cancelled = self.running.get(rid) or threading.Event()
        if request.get("prompt") is None and not request.get("messages"):
            raise BridgeError("invalid_request", "generate needs a prompt or messages")

        def emit(text):
            if text:
                self.reply(rid, "token", text=text)

        finish, prompt_tokens, completion_tokens, stop = adapter.generate(request, emit, cancelled)
        self.reply(
            rid,
            "done",
            finish_reason=finish,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=int(completion_tokens),
            stop_sequence=stop,
        )

    def op_count(self, rid, request):
        adapter = self.loaded()
        if request.get("prompt") is None and not request.get("messages"):
            raise BridgeError("invalid_request", "count needs a prompt or messages")
        self.reply(rid, "counted", prompt_tokens=int(adapter.count(request)))

    def op_embed(self, rid, request):
        vectors, prompt_tokens = self.loaded().embed(list(request.get("inputs") or []))
        self.reply(rid, "embeddings", vectors=vectors, prompt_tokens=int(prompt_tokens))

    def op_rerank(self, rid, request):
        scores, prompt_tokens = self.loaded().rerank(
            request.get("query") or "", list(request.get("documents") or [])
        )
        self.reply(rid, "rerankings", scores=scores, prompt_tokens=int(prompt_tokens))

    def op_sleep(self, rid, request):
        level = request.get("level")
        if not isinstance(level, int) or isinstance(level, bool) or level not in (1, 2):
            raise BridgeError("invalid_request", f"sleep takes level 1 or 2, not {level!r}")
        self.sleep_mode("sleep")(level)
        self.reply(rid, "ok")

    def op_wake(self, rid, request):
        self.sleep_mode("wake")()
        self.reply(rid, "ok")

    def sleep_mode(self, name):
        """The loaded adapter's `sleep` or `wake`; `unsupported` when its engine cannot sleep."""
        method = getattr(self.loaded(), name, None)
        if method is None:
            raise BridgeError("unsupported", f"the {self.engine} engine cannot sleep")
        return method

    def op_unload(self, rid, request):
        adapter, self.adapter = self.adapter, None
        for event in list(self.running.values()):
            event.set()
        # Let running generations see their cancel before the engine goes (10 s at most).
        deadline = time.monotonic() + 10
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)
        if adapter is not None:
            adapter.unload()
            log("unloaded")
        self.reply(rid, "ok")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hangar_bridge")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--socket", help="the Unix socket Hangar listens on")
    group.add_argument("--check", metavar="ENGINE", help="check that ENGINE's packages exist")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.check)

    def terminate(signum, frame):
        log("SIGTERM; exiting")
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(args.socket)
    except OSError as e:
        log(f"cannot connect to {args.socket}: {e}")
        return 2
    log(f"connected to {args.socket} (python {sys.version.split()[0]}, pid {os.getpid()})")
    Session(sock).serve()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
