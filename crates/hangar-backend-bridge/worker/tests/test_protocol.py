"""End to end: `python -u -m hangar_bridge --socket PATH` driven over a Unix socket this test
listens on, with the fake exllamav3 (fakes/) as the engine; and `--check`.

Run: python3 -m unittest discover -s crates/hangar-backend-bridge/worker/tests \
    -t crates/hangar-backend-bridge/worker
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

from tests.helpers import FAKES, WORKER, generate, model

SCRIPT = ["Hel", "lo"] + ["."] * 2000  # at DELAY: 10 s, long enough to be cancelled first
DELAY = "0.005"


class Worker:
    """One worker process and its connection."""

    def __init__(self, with_fakes=True, **extra_env):
        self.dir = tempfile.TemporaryDirectory()
        path = os.path.join(self.dir.name, "bridge.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        server.settimeout(20)
        self.record = os.path.join(self.dir.name, "calls.jsonl")
        environ = dict(os.environ, FAKE_ENGINE_RECORD=self.record, **extra_env)
        environ["PYTHONPATH"] = os.pathsep.join([WORKER] + ([FAKES] if with_fakes else []))
        self.log = open(os.path.join(self.dir.name, "worker.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "hangar_bridge", "--socket", path],
            env=environ, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir.name,
        )
        self.conn, _ = server.accept()
        server.close()
        self.conn.settimeout(20)
        self.reader = self.conn.makefile("rb")
        self.pending = []
        self.next_id = 100

    def send(self, op, rid=None, **fields):
        if rid is None:
            self.next_id += 1
            rid = self.next_id
        self.conn.sendall((json.dumps({"id": rid, "op": op, **fields}) + "\n").encode())
        return rid

    def send_raw(self, obj):
        self.conn.sendall((json.dumps(obj) + "\n").encode())

    def read(self):
        if self.pending:
            return self.pending.pop(0)
        line = self.reader.readline()
        if not line:
            raise EOFError("the worker closed the connection")
        return json.loads(line)

    def until_final(self, rid):
        """Messages for `rid` up to its final one; others are kept for later."""
        mine, others = [], []
        while True:
            message = self.pending.pop(0) if self.pending else self.read()
            if message.get("id") != rid:
                others.append(message)
                continue
            mine.append(message)
            if message["type"] != "token":
                self.pending = others + self.pending
                return mine

    def call(self, op, **fields):
        return self.until_final(self.send(op, **fields))[-1]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.conn.close()
        self.log.close()
        self.dir.cleanup()

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()


def tokens_text(messages):
    return "".join(m["text"] for m in messages if m["type"] == "token")


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.model_dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.model_dir.cleanup()

    def start(self, **kwargs):
        worker = Worker(**kwargs)
        self.addCleanup(worker.close)
        return worker

    def test_session_with_fake_exllamav3(self):
        w = self.start(FAKE_ENGINE_SCRIPT=json.dumps(SCRIPT), FAKE_ENGINE_DELAY=DELAY)
        # Nothing but hello before hello.
        self.assertEqual(w.call("ping"), {"id": w.next_id, "type": "error", "code": "protocol",
                                          "message": "'ping' before hello"})
        hello = w.call("hello", protocol=1)
        self.assertEqual((hello["type"], hello["protocol"], hello["worker"]),
                         ("hello", 1, "hangar_bridge"))
        self.assertEqual(hello["engines"], ["ct2", "exllamav3", "vllm"])
        self.assertEqual(hello["python"], sys.version.split()[0])
        self.assertEqual(w.call("ping")["type"], "pong")
        self.assertEqual(w.call("frobnicate")["code"], "protocol")
        not_loaded = w.until_final(w.send("generate", **_gen()))
        self.assertEqual(not_loaded[-1]["code"], "not_loaded")
        self.assertEqual(w.call("count", **_gen())["code"], "not_loaded")

        loaded = w.call("load", engine="exllamav3",
                        model=model(self.model_dir.name, exllama_cache_quant="8,4"))
        self.assertEqual(loaded["type"], "loaded", loaded)
        self.assertEqual(loaded["max_parallel_sequences"], 256)
        details = loaded["details"]
        self.assertEqual((details["cache_k_bits"], details["cache_v_bits"]), (8, 4))

        # A generation that reaches max_tokens.
        messages = w.until_final(w.send("generate", **_gen(max_tokens=4)))
        self.assertEqual(tokens_text(messages), "Hello..")
        self.assertEqual(messages[-1]["type"], "done")
        self.assertEqual(messages[-1]["finish_reason"], "length")
        self.assertEqual(messages[-1]["completion_tokens"], 4)
        # `count` reads the same prompt and generates nothing.
        counted = w.call("count", **_gen(max_tokens=4))
        self.assertEqual(counted, {"id": w.next_id, "type": "counted",
                                   "prompt_tokens": messages[-1]["prompt_tokens"]})

        # A stop sequence.
        messages = w.until_final(w.send("generate", **_gen(stop=["lo."])))
        self.assertEqual((tokens_text(messages), messages[-1]["finish_reason"]), ("Hel", "stop"))
        self.assertEqual(messages[-1]["stop_sequence"], 0)

        # A long generation: ping answered while it runs, then cancelled.
        long_id = w.send("generate", **_gen())
        first = w.read()
        self.assertEqual((first["id"], first["type"]), (long_id, "token"))
        ping_id = w.send("ping")
        pong = w.until_final(ping_id)[-1]
        self.assertEqual(pong["type"], "pong")
        cancel = w.call("cancel", target=long_id)
        self.assertEqual(cancel["type"], "ok")
        rest = w.until_final(long_id)
        self.assertEqual((rest[-1]["type"], rest[-1]["code"]), ("error", "cancelled"))
        self.assertLess(len(first["text"] + tokens_text(rest)), len("".join(SCRIPT)))

        # A second load is refused while one is loaded; unload; then not_loaded.
        again = w.call("load", engine="exllamav3", model=model(self.model_dir.name))
        self.assertEqual(again["code"], "load_failed")
        self.assertEqual(w.call("unload")["type"], "ok")
        self.assertEqual(w.until_final(w.send("generate", **_gen()))[-1]["code"], "not_loaded")
        # A new load after unload works.
        again = w.call("load", engine="exllamav3", model=model(self.model_dir.name))
        self.assertEqual(again["type"], "loaded")

        self.assertEqual(w.call("shutdown")["type"], "ok")
        self.assertEqual(w.proc.wait(10), 0)
        self.assertEqual(w.reader.readline(), b"")
        log = w.output()
        self.assertIn("loaded", log)
        self.assertIn(f"cancelled request {long_id}", log)

    def test_ping_while_loading_and_unload_while_generating(self):
        gate = os.path.join(self.model_dir.name, "load-gate")
        w = self.start(FAKE_ENGINE_SCRIPT=json.dumps(SCRIPT), FAKE_ENGINE_DELAY=DELAY,
                       FAKE_ENGINE_LOAD_GATE=gate)
        w.call("hello", protocol=1)
        load_id = w.send("load", engine="exllamav3", model=model(self.model_dir.name))
        ping_id = w.send("ping")
        first = w.read()
        self.assertEqual((first["id"], first["type"]), (ping_id, "pong"))
        open(gate, "w").close()  # the load ends only now
        self.assertEqual(w.until_final(load_id)[-1]["type"], "loaded")
        gen_id = w.send("generate", **_gen())
        self.assertEqual(w.read()["id"], gen_id)
        unload_id = w.send("unload")
        finals = {}
        while len(finals) < 2:
            message = w.read()
            if message["type"] != "token":
                finals[message["id"]] = message
        self.assertEqual(finals[gen_id]["code"], "cancelled")
        self.assertEqual(finals[unload_id]["type"], "ok")
        self.assertIn('"call": "Model.unload"', _record_lines(w))

    def test_load_errors(self):
        w = self.start()
        w.call("hello", protocol=1)
        unknown = w.call("load", engine="llama", model=model(self.model_dir.name))
        self.assertEqual(unknown["code"], "unknown_engine")
        missing = w.call("load", engine="exllamav3",
                         model=model(os.path.join(self.model_dir.name, "absent")))
        self.assertEqual(missing["code"], "not_found")
        self.assertEqual(w.call("embed", inputs=["x"])["code"], "not_loaded")

    def test_missing_package(self):
        w = self.start(with_fakes=False)
        w.call("hello", protocol=1)
        reply = w.call("load", engine="exllamav3", model=model(self.model_dir.name))
        if reply["type"] == "loaded":
            self.skipTest("a real exllamav3 is installed")
        self.assertEqual(reply["code"], "missing_package")
        self.assertEqual(reply["package"], "exllamav3")
        self.assertEqual(os.path.realpath(reply["python"]),
                         os.path.realpath(sys.executable))  # relative or symlinked spellings
        self.assertIn("pip install exllamav3", reply["message"])

    def test_malformed_lines(self):
        w = self.start()
        w.conn.sendall(b"not json\n")
        self.assertEqual(w.read()["code"], "protocol")
        w.send_raw({"op": "hello"})
        self.assertEqual(w.read()["code"], "protocol")

    def test_exits_when_the_connection_closes(self):
        w = self.start()
        w.call("hello", protocol=1)
        w.conn.shutdown(socket.SHUT_RDWR)
        self.assertEqual(w.proc.wait(10), 0)

    def test_exits_on_sigterm(self):
        w = self.start()
        w.call("hello", protocol=1)
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(10)
        self.assertEqual(w.reader.readline(), b"")


def _record_lines(worker):
    with open(worker.record) as f:
        return f.read()


def _gen(**params):
    request = generate(**params)
    return {k: v for k, v in request.items() if k not in ("id", "op")}


class CheckTest(unittest.TestCase):
    def check(self, engine, with_fakes):
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join([WORKER] + ([FAKES] if with_fakes else []))
        proc = subprocess.run([sys.executable, "-m", "hangar_bridge", "--check", engine],
                              env=environ, capture_output=True, text=True, timeout=30)
        lines = proc.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stdout + proc.stderr)
        return proc.returncode, json.loads(lines[0])

    def test_present(self):
        code, out = self.check("exllamav3", with_fakes=True)
        self.assertEqual((code, out["ok"], out["engine"]), (0, True, "exllamav3"))

    def test_missing(self):
        code, out = self.check("vllm", with_fakes=False)
        if code == 0:
            self.skipTest("a real vllm is installed")
        self.assertEqual(code, 3)
        self.assertEqual((out["code"], out["package"]), ("missing_package", "vllm"))
        self.assertEqual(os.path.realpath(out["python"]), os.path.realpath(sys.executable))

    def test_unknown_engine(self):
        code, out = self.check("llama", with_fakes=False)
        self.assertEqual((code, out["code"]), (3, "unknown_engine"))


if __name__ == "__main__":
    unittest.main()
