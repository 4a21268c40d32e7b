"""hangard's KServe v2 gRPC service through NVIDIA's `tritonclient.grpc`: liveness,
readiness, server and model metadata, the repository index (all and ready-only, compared with
the HTTP index), load with and without a config, unload, model readiness, unknown models,
and, when HANGAR_ADMIN_KEY is set, the admin key. Exits non-zero on the first failed check.

Usage: HANGAR_URL=http://127.0.0.1:PORT HANGAR_GRPC_URL=127.0.0.1:GRPC_PORT \
       [HANGAR_ADMIN_KEY=…] python triton_grpc.py  (demo config)
"""

import json
import os
import urllib.error
import urllib.request

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

BASE = os.environ["HANGAR_URL"]
KEY = os.environ.get("HANGAR_ADMIN_KEY")
HEADERS = {"authorization": f"Bearer {KEY}"} if KEY else None
client = grpcclient.InferenceServerClient(url=os.environ["HANGAR_GRPC_URL"])
MODEL = "chat-thinking"  # configured, not enabled: unloaded at start


def check(name, fn):
    fn()
    print(f"  ok  {name}", flush=True)


def http_index(ready):
    body = json.dumps({"ready": ready}).encode()
    request = urllib.request.Request(f"{BASE}/v2/repository/index", data=body, method="POST")
    request.add_header("content-type", "application/json")
    if KEY:
        request.add_header("authorization", f"Bearer {KEY}")
    with urllib.request.urlopen(request) as response:
        return {m["name"]: (m["state"], m["reason"]) for m in json.load(response)}


def http_ready():
    try:
        with urllib.request.urlopen(f"{BASE}/v2/health/ready") as response:
            return response.status == 200
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
        return False


def index():
    answer = client.get_model_repository_index(headers=HEADERS, as_json=True)
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in answer.get("models", [])}


def ready_index():
    # tritonclient's get_model_repository_index has no `ready` flag: send the request itself.
    from tritonclient.grpc import service_pb2

    request = service_pb2.RepositoryIndexRequest(ready=True)
    metadata = tuple(HEADERS.items()) if HEADERS else ()
    answer = client._client_stub.RepositoryIndex(request, metadata=metadata)
    return {m.name: (m.state, m.reason) for m in answer.models}


def expect_error(fn, code, text):
    try:
        fn()
    except InferenceServerException as e:
        assert e.status() == code, (e.status(), str(e))
        assert text in str(e), str(e)
    else:
        raise AssertionError(f"no {code}")


def health():
    assert client.is_server_live()
    # Ready means every enabled model is loaded, as over HTTP. The scripts before this one may
    # have evicted one (a load beyond the demo's slots takes the least recently used one's);
    # the keyed run starts on a fresh server, where the demo's enabled models are loaded.
    ready = client.is_server_ready()
    assert ready == http_ready(), (ready, http_ready())
    assert ready or not KEY, "a fresh demo server is ready"
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "hangar" and "model_repository" in meta["extensions"], meta
    model = client.get_model_metadata("tiny-llama-gguf", as_json=True)
    assert model["platform"] == "llama_cpp" and model["versions"] == ["1"], model


def repository_index():
    models = index()
    assert models == http_index(False), (models, http_index(False))
    assert models["chat"][0] == "READY", models["chat"]
    assert models[MODEL][0] == "UNAVAILABLE", models[MODEL]
    ready = ready_index()
    assert ready == http_index(True), ready
    assert MODEL not in ready and "chat" in ready, sorted(ready)


def load_and_unload():
    assert not client.is_model_ready(MODEL)
    client.load_model(MODEL, headers=HEADERS)
    assert client.is_model_ready(MODEL)
    assert index()[MODEL][0] == "READY"
    client.unload_model(MODEL, headers=HEADERS, unload_dependents=True)
    assert not client.is_model_ready(MODEL)
    assert index()[MODEL][0] != "READY"


def load_with_config():
    client.load_model("chat", headers=HEADERS, config=json.dumps({"replicas": 1}))
    request = urllib.request.Request(f"{BASE}/v1/admin/models/chat")
    if KEY:
        request.add_header("authorization", f"Bearer {KEY}")
    with urllib.request.urlopen(request) as response:
        row = json.load(response)
    assert row["runtime_state"] == "loaded" and row["loaded_replicas"] == 1, row
    client.load_model("chat", headers=HEADERS, config=json.dumps({"replicas": 2}))


def unknown_model():
    expect_error(lambda: client.load_model("no-such-model", headers=HEADERS), "StatusCode.NOT_FOUND", "no-such-model")
    expect_error(lambda: client.is_model_ready("no-such-model"), "StatusCode.NOT_FOUND", "no-such-model")
    expect_error(lambda: client.load_model(MODEL, headers=HEADERS, files={"file:1/model.onnx": b"x"}, config="{}"), "StatusCode.INVALID_ARGUMENT", "file:")


def admin_key():
    expect_error(lambda: client.get_model_repository_index(), "StatusCode.UNAUTHENTICATED", "admin")
    wrong = {"authorization": "Bearer wrong"}
    expect_error(lambda: client.load_model(MODEL, headers=wrong), "StatusCode.PERMISSION_DENIED", "not valid")
    assert not client.is_model_ready(MODEL), "the refused load changed nothing"
    assert client.is_server_live()  # health stays open


def main():
    print(f"tritonclient.grpc against {os.environ['HANGAR_GRPC_URL']}" + (" (admin key)" if KEY else ""))
    check("live, ready, server and model metadata", health)
    check("get_model_repository_index (all and ready-only, as over HTTP)", repository_index)
    check(f"load_model({MODEL}) + is_model_ready + unload_model", load_and_unload)
    check("load_model(chat, config=…) reloads with the override", load_with_config)
    check("unknown model and file: parameters refused", unknown_model)
    if KEY:
        check("the admin key is required for the repository", admin_key)


if __name__ == "__main__":
    main()
