"""hangard through the official `anthropic` SDK (Messages API), the same run against each
engine: the trained SmolLM2 in-process (llama.cpp, the model's own template) and under a
`llama-server` child on the demo server, and, on a second hangard this script starts, the
fake `vllm serve` and an `openai_remote` model whose remote is the demo server (both through
translation to the chat route). For each: a message, a stream, a system prompt with several
turns (equal to the chat route's answer and usage), a tool-use round trip with `tool_choice:
any`, a stop sequence named, structured output, count_tokens equal to the usage of the same
request, and a client that hangs up cancelling its generation. Then thinking on and off with
the thinking stub (its blocks and signature, sent back on the next turn) and through Qwen3's
own template (the demo's tiny random-weight Qwen3: the switch rendered as on the chat route), and
Anthropic-shaped errors for an unknown model, one not loaded, one loading, a quarantined one
and a full queue. With HANGAR_INFERENCE_KEY the key goes as `x-api-key` (the SDK's way), the
remote model sends it to the demo server, and a wrong one is refused. Exits non-zero on the
first failure.

Usage: HANGAR_URL=http://127.0.0.1:PORT HANGARD=target/debug/hangard python anthropic_client.py
(demo config; run from the repository root)
"""

import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import anthropic

BASE = os.environ["HANGAR_URL"].rstrip("/")
ADMIN_KEY = os.environ.get("HANGAR_ADMIN_KEY")
KEY = os.environ.get("HANGAR_INFERENCE_KEY")
HANGARD = os.environ.get("HANGARD", "target/debug/hangard")
FAKE_VLLM = os.path.abspath("crates/hangar-backend-process/tests/fake-vllm/vllm")
client = anthropic.Anthropic(base_url=BASE, api_key=KEY or "unused", max_retries=0, timeout=120)

THINKER = "chat-thinking"  # stub with thinking modes; configured, not enabled
SLOW = "chat-slow"  # stub that takes 3 s to load
QUESTION = "What is the capital of France? Answer in one word."
# Anthropic's current SDK has no `temperature` argument; Hangar takes it from the body, where
# `extra_body` puts it. Greedy: the same request gives the same text.
GREEDY = {"extra_body": {"temperature": 0}, "max_tokens": 24}


class Engine:
    """One model to run the checks on: its server, and what its engine is expected to do."""

    def __init__(self, label, model, base, sdk, admin_key=None, trained=True, stop="end_turn",
                 tools=True, structured=True):
        self.label, self.model, self.base, self.sdk, self.admin_key = label, model, base, sdk, admin_key
        self.trained = trained  # SmolLM2: the answer says Paris, the same on every engine
        self.stop = stop  # the stop_reason of the plain message (the fake vLLM runs to max_tokens)
        self.tools = tools  # whether the engine forces a call for `tool_choice: any`
        self.structured = structured  # whether the engine constrains output to a schema


def check(name, fn):
    started = time.monotonic()
    fn()
    print(f"  ok  {name}  ({time.monotonic() - started:.2f}s)", flush=True)


def http(method, path, body=None, base=BASE, key=ADMIN_KEY):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    if key:
        request.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            if response.headers.get_content_type() != "application/json":
                return response.status, response.read().decode()
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def row(e, model=None):
    status, body = http("GET", f"/v1/admin/models/{model or e.model}", base=e.base, key=e.admin_key)
    assert status == 200, body
    return body


def text(message):
    return "".join(b.text for b in message.content if b.type == "text")


def used(m):
    return m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def ask(e, **request):
    return e.sdk.messages.create(model=e.model, messages=[{"role": "user", "content": QUESTION}], **{**GREEDY, **request})


REFERENCE = {}


def message(e):
    m = ask(e)
    assert m.type == "message" and m.role == "assistant" and m.model == e.model, m
    assert text(m) and (not e.trained or "Paris" in text(m)), m
    if e.trained:
        # The in-process engine's greedy answer, from every engine that runs SmolLM2.
        reference = REFERENCE.setdefault("text", text(m))
        assert text(m) == reference, (e.label, text(m), reference)
    assert m.stop_reason == e.stop and m.stop_sequence is None, m
    assert used(m) > 0 and m.usage.output_tokens > 0, m
    return m


def stream(e):
    whole = text(message(e))
    with e.sdk.messages.stream(model=e.model, messages=[{"role": "user", "content": QUESTION}], **GREEDY) as s:
        kinds = [event.type for event in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_delta" in kinds and "message_delta" in kinds, kinds
    assert text(final) == whole, (text(final), whole)
    assert final.stop_reason == e.stop and final.usage.output_tokens > 0, final


def system_and_turns(e):
    system = "You are a geography teacher. Answer in one word."
    turns = [
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And of France?"},
    ]
    blocks = turns[:2] + [{"role": "user", "content": [{"type": "text", "text": "And of France?"}]}]
    m = e.sdk.messages.create(model=e.model, system=system, messages=blocks, **GREEDY)
    # The same conversation through the chat route gives the same greedy answer: the system
    # prompt and the turns reach the model's template as they do there.
    chat = {"model": e.model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "system", "content": system}] + turns}
    status, body = http("POST", "/v1/chat/completions", chat, base=e.base, key=e.admin_key)
    assert status == 200, body
    assert text(m) == body["choices"][0]["message"]["content"], (m, body)
    assert body["usage"]["prompt_tokens"] == used(m), (body["usage"], m.usage)
    # And they are in the prompt: it is longer than the last question alone.
    alone = e.sdk.messages.create(model=e.model, messages=[turns[-1]], **GREEDY)
    assert used(m) > used(alone), (m.usage, alone.usage)


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_round_trip(e):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = e.sdk.messages.create(
        model=e.model, messages=[question], tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=64,
        extra_body={"temperature": 0},
    )
    assert call.stop_reason == "tool_use", call
    use = next(b for b in call.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input.get("city"), str), use
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees and sunny"}
    turns = [question, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = e.sdk.messages.create(
        model=e.model, messages=turns, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=48,
        extra_body={"temperature": 0},
    )
    assert answer.stop_reason != "tool_use" and text(answer).strip(), answer


def stop_sequence(e):
    said = text(message(e))
    word = said.split()[-1].strip(".")
    m = ask(e, stop_sequences=["<never>", word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word, m
    assert said.startswith(text(m)), (text(m), said)
    question = [{"role": "user", "content": QUESTION}]
    with e.sdk.messages.stream(model=e.model, messages=question, stop_sequences=["<never>", word], **GREEDY) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text(final)) == ("stop_sequence", word, text(m)), final


def structured_output(e):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
    m = ask(e, output_config={"format": {"type": "json_schema", "schema": schema}}, max_tokens=48)
    assert isinstance(json.loads(text(m))["capital"], str), m


def count_tokens(e):
    request = {"model": e.model, "system": "Be brief.", "messages": [{"role": "user", "content": QUESTION}]}
    counted = e.sdk.messages.count_tokens(**request)
    m = e.sdk.messages.create(**request, **GREEDY)
    assert counted.input_tokens == used(m), (counted, m.usage)


def cancelled(e):
    status, metrics = http("GET", "/metrics", base=e.base, key=e.admin_key)
    assert status == 200, metrics
    line = rf'hangar_requests_total{{endpoint="messages",model="{re.escape(e.model)}",outcome="cancelled"}} (\d+)'
    found = re.search(line, metrics)
    return int(found.group(1)) if found else 0


def hang_up(e):
    before = cancelled(e)
    long = {"role": "user", "content": "Write a very long story about the sea."}
    with e.sdk.messages.stream(model=e.model, max_tokens=1500, messages=[long]) as s:
        for event in s:
            if event.type == "content_block_delta":
                break
        assert row(e)["inflight_requests"] == 1
    deadline = time.monotonic() + 30
    while row(e)["inflight_requests"] != 0 or cancelled(e) != before + 1:
        assert time.monotonic() < deadline, "the generation kept running after the client left"
        time.sleep(0.05)


def thinking():
    status, body = http("POST", f"/v1/admin/models/{THINKER}/load", {})
    assert status == 200, body
    on = client.messages.create(
        model=THINKER,
        max_tokens=64,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "think first"}],
    )
    kinds = [b.type for b in on.content]
    assert kinds == ["thinking", "text"], on
    assert on.content[0].thinking and on.content[0].signature, on
    # The blocks go back as the next turn's history, signature and all.
    again = client.messages.create(
        model=THINKER,
        max_tokens=64,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[
            {"role": "user", "content": "think first"},
            {"role": "assistant", "content": on.content},
            {"role": "user", "content": "and again"},
        ],
    )
    assert [b.type for b in again.content] == ["thinking", "text"], again
    with client.messages.stream(
        model=THINKER, max_tokens=64, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "think first"}],
    ) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        streamed = s.get_final_message()
    assert "thinking_delta" in deltas and "signature_delta" in deltas and "text_delta" in deltas, deltas
    assert [b.type for b in streamed.content] == ["thinking", "text"], streamed
    hidden = client.messages.create(
        model=THINKER,
        max_tokens=64,
        thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
        messages=[{"role": "user", "content": "think first"}],
    )
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == "", hidden
    assert hidden.content[0].signature == on.content[0].signature, (hidden, on)
    off = client.messages.create(
        model=THINKER, max_tokens=64, thinking={"type": "disabled"}, messages=[{"role": "user", "content": "hi"}]
    )
    assert [b.type for b in off.content] == ["text"], off


def thinking_template():
    """`thinking` reaches a real template's switch: Qwen3's, on the demo's tiny Qwen3 (random
    weights, CTranslate2), whose template writes an empty reasoning block when thinking is off.
    Each mode's prompt and greedy answer equal the chat route's for the same `thinking`, and
    count_tokens (the bridge worker's `count`) equals the prompt."""
    answers = {}
    for mode in ("enabled", "disabled"):
        m = client.messages.create(
            model="tiny-qwen3-ct2", max_tokens=8, thinking={"type": mode, "budget_tokens": 1024},
            messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 0},
        )
        chat = {"model": "tiny-qwen3-ct2", "max_tokens": 8, "temperature": 0, "thinking": mode,
                "messages": [{"role": "user", "content": "hi"}]}
        status, body = http("POST", "/v1/chat/completions", chat)
        assert status == 200, body
        assert used(m) == body["usage"]["prompt_tokens"], (mode, m.usage, body["usage"])
        counted = client.messages.count_tokens(
            model="tiny-qwen3-ct2", thinking={"type": mode, "budget_tokens": 1024},
            messages=[{"role": "user", "content": "hi"}],
        )
        assert counted.input_tokens == used(m), (mode, counted, m.usage)
        assert text(m) == body["choices"][0]["message"]["content"], (mode, m, body)
        answers[mode] = m
    # Off, the template closes an empty reasoning block after the turn: more prompt tokens.
    assert used(answers["disabled"]) > used(answers["enabled"]), answers
    assert all(b.type == "text" for b in answers["disabled"].content), answers["disabled"]
    # The bridge names the stop sequence it met too.
    said = text(answers["disabled"])
    stop = said[3:5]
    m = client.messages.create(
        model="tiny-qwen3-ct2", max_tokens=8, thinking={"type": "disabled"}, stop_sequences=["<never>", stop],
        messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 0},
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, (said, m)
    assert text(m) == said[: said.index(stop)], (said, m)


def expect(error_class, status, code, sdk=client, **request):
    try:
        sdk.messages.create(max_tokens=8, messages=[{"role": "user", "content": "hi"}], **request)
    except error_class as e:
        assert e.status_code == status, (e.status_code, e.body)
        assert e.body["type"] == "error" and e.body["error"]["code"] == code, e.body
        assert e.body["error"]["type"] and e.body["error"]["message"], e.body
        return e
    raise AssertionError(f"{request} was answered, not refused with {status} {code}")


def errors():
    expect(anthropic.NotFoundError, 404, "unknown_model", model="no-such-model")
    status, body = http("POST", f"/v1/admin/models/{THINKER}/unload", {})
    assert status == 200, body
    expect(anthropic.InternalServerError, 503, "model_not_loaded", model=THINKER)
    # chat-slow takes 3 s to load; the scripts after this one expect it unloaded (as the
    # demo starts), so it is unloaded again.
    was_loaded = http("GET", f"/v1/admin/models/{SLOW}")[1]["runtime_state"] == "loaded"
    if was_loaded:
        assert http("POST", f"/v1/admin/models/{SLOW}/unload", {})[0] == 200
    loading = threading.Thread(target=http, args=("POST", f"/v1/admin/models/{SLOW}/load", {}))
    loading.start()
    deadline = time.monotonic() + 5
    while http("GET", f"/v1/admin/models/{SLOW}")[1]["runtime_state"] != "loading":
        assert time.monotonic() < deadline, "chat-slow never started loading"
        time.sleep(0.02)
    expect(anthropic.InternalServerError, 503, "model_loading", model=SLOW)
    loading.join()
    if not was_loaded:
        assert http("POST", f"/v1/admin/models/{SLOW}/unload", {})[0] == 200
    expect(anthropic.BadRequestError, 400, "invalid_request", model="smollm2", extra_body={"temperature": 1.5})


def quarantined_and_full(second):
    """On the second server: `broken` fails to load twice (quarantine after 2 failures), and
    `slow` (one request at a time, a queue of 1) is kept busy."""
    for _ in range(2):
        status, body = http("POST", "/v1/admin/models/broken/load", {}, base=second.base, key=None)
        assert status >= 400, body
    refused = expect(anthropic.InternalServerError, 503, "model_quarantined", sdk=second.sdk, model="broken")
    assert refused.response.headers.get("retry-after"), refused.response.headers
    status, body = http("POST", "/v1/admin/models/slow/load", {}, base=second.base, key=None)
    assert status == 200, body
    long = {"role": "user", "content": "a long answer please"}
    with second.sdk.messages.stream(model="slow", max_tokens=400, messages=[long]) as s:
        next(iter(s))
        queued = threading.Thread(
            target=lambda: second.sdk.messages.create(model="slow", max_tokens=1, messages=[long])
        )
        queued.start()
        deadline = time.monotonic() + 10
        while row(second, "slow")["queue_depth"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.02)
        expect(anthropic.RateLimitError, 429, "queue_full", sdk=second.sdk, model="slow")
    queued.join()


def keys():
    wrong = anthropic.Anthropic(base_url=BASE, api_key="wrong-key", max_retries=0)
    try:
        wrong.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    except anthropic.PermissionDeniedError as e:
        assert e.body["error"]["type"] == "permission_error", e.body
        return
    raise AssertionError("a wrong x-api-key was accepted")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def second_server(workdir):
    """A hangard of its own (no keys, loopback): the fake vLLM, a remote model served by the
    demo server, and the stubs the quarantine and queue checks need."""
    remote = {"backend": "openai_remote", "enabled": True, "openai_base_url": f"{BASE}/v1", "openai_model": "smollm2"}
    if KEY:
        remote["openai_api_key_env"] = "HANGAR_E2E_REMOTE_KEY"
    settings = {
        "max_loaded_models": {"llm": 4},
        "max_queue_depth": 1,
        "quarantine": {"failures": 2, "window_seconds": 60, "backoff_seconds": 30, "max_backoff_seconds": 60},
        "children": {"pass_env": ["FAKE_VLLM_*"]},
        "models": {
            "vllm": {"backend": "vllm_serve", "enabled": True, "vllm_binary_path": FAKE_VLLM,
                     "vllm_model": "Qwen/Qwen3-0.6B"},
            "remote": remote,
            "broken": {"backend": "stub", "stub": {"fail_load": "corrupt weights"}},
            "slow": {"backend": "stub", "enabled": True, "target_inflight": 1, "stub": {"token_latency_ms": 50}},
        },
    }
    with open(os.path.join(workdir, "settings.json"), "w") as f:
        json.dump(settings, f)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
    # The fake writes 400 words, 10 ms apart: long enough for a client to hang up mid-answer.
    env.update(FAKE_VLLM_TOKENS="400", FAKE_VLLM_TOKEN_DELAY_MS="10", HANGAR_E2E_REMOTE_KEY=KEY or "")
    log = open(os.path.join(workdir, "hangard.log"), "w")
    args = [HANGARD, "serve", "--config", workdir, "--port", str(port), "--grpc-port", "0"]
    process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the second hangard did not get ready: " + open(log.name).read()[-4000:])
        time.sleep(0.1)
    return process, base


def engine_checks(e):
    checks = [
        ("message", message),
        ("stream", stream),
        ("system prompt and several turns", system_and_turns),
        ("tool-use round trip (tool_choice any)", tool_round_trip),
        ("stop sequence", stop_sequence),
        ("structured output (output_config.format)", structured_output),
        ("count_tokens equals usage", count_tokens),
        ("a client that hangs up cancels", hang_up),
    ]
    skipped = {"tool-use round trip (tool_choice any)": not e.tools,
               "structured output (output_config.format)": not e.structured}
    for name, fn in checks:
        if skipped.get(name):
            print(f"  --  {e.label}: {name}: not this engine's (see the docstring of Engine)", flush=True)
            continue
        check(f"{e.label}: {name}", lambda: fn(e))


def main():
    print(f"anthropic SDK {anthropic.__version__} against {BASE}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hangar-anthropic-") as workdir:
        process, second_base = second_server(workdir)
        try:
            sdk = anthropic.Anthropic(base_url=second_base, api_key="unused", max_retries=0, timeout=120)
            engines = [
                Engine("in-process llama.cpp", "smollm2", BASE, client, ADMIN_KEY),
                # llama-server lets a model write text before a forced call, and SmolLM2's
                # template renders no tools: it never calls one (the note of issue 40).
                Engine("llama_server", "smollm2-server", BASE, client, ADMIN_KEY, tools=False),
                Engine("vllm_serve (fake)", "vllm", second_base, sdk, trained=False, stop="max_tokens",
                       structured=False),
                Engine("openai_remote", "remote", second_base, sdk),
            ]
            for e in engines:
                engine_checks(e)
            check("thinking on and off (stub)", thinking)
            check("thinking on and off through Qwen3's template", thinking_template)
            check("errors in Anthropic's envelope", errors)
            check("quarantined and queue full", lambda: quarantined_and_full(engines[2]))
            if KEY:
                check("x-api-key: a wrong key is refused", keys)
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
