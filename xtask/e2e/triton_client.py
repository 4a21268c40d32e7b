"""hangard's KServe v2 model repository through NVIDIA's `tritonclient.http`: liveness, the
repository index, load, readiness and unload. Exits non-zero on the first failed check.

Usage: HANGAR_URL=http://127.0.0.1:PORT python triton_client.py  (demo config)
"""

import os
from urllib.parse import urlparse

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

BASE = os.environ["HANGAR_URL"]
client = httpclient.InferenceServerClient(url=urlparse(BASE).netloc)
MODEL = "chat-thinking"  # configured, not enabled: unloaded at start


def check(name, fn):
    fn()
    print(f"  ok  {name}", flush=True)


def index():
    return {m["name"]: m for m in client.get_model_repository_index()}


def live():
    assert client.is_server_live()


def repository_index():
    models = index()
    assert models["chat"]["state"] == "READY", models["chat"]
    assert models[MODEL].get("state") != "READY", models[MODEL]
    assert "tiny-llama-gguf" in models, sorted(models)


def load():
    assert not client.is_model_ready(MODEL)
    client.load_model(MODEL)
    assert client.is_model_ready(MODEL)
    assert index()[MODEL]["state"] == "READY"


def unload():
    client.unload_model(MODEL)
    assert not client.is_model_ready(MODEL)
    assert index()[MODEL].get("state") != "READY"


def load_unknown():
    try:
        client.load_model("no-such-model")
    except InferenceServerException as e:
        assert "no-such-model" in str(e), e
    else:
        raise AssertionError("loading an unknown model succeeded")


def main():
    print(f"tritonclient.http against {BASE}")
    check("is_server_live", live)
    check("get_model_repository_index", repository_index)
    check(f"load_model({MODEL}) + is_model_ready", load)
    check(f"unload_model({MODEL})", unload)
    check("load_model(unknown) raises", load_unknown)


if __name__ == "__main__":
    main()
