"""hangard through the official `anthropic` SDK (Messages API): a message, a stream, a system
prompt, several turns, a tool-use round trip with `tool_choice: any`, a stop sequence, all on
the trained SmolLM2 (in-process llama.cpp, the model's own template); count_tokens equal to
the usage of the same request; thinking on and off with the thinking stub (its blocks and
signature, sent back on the next turn); a client that hangs up cancelling its generation;
the same message and stream from SmolLM2 under a `llama-server` child (the request
translated to its chat route); and Anthropic-shaped errors for an unknown model, one not
loaded, one loading, and count_tokens where the engine cannot count. With HANGAR_INFERENCE_KEY the key goes as
`x-api-key` (the SDK's way) and a wrong one is refused. Exits non-zero on the first failure.

Usage: HANGAR_URL=http://127.0.0.1:PORT python anthropic_client.py  (demo config)
"""

import json
import os
import threading
import time
import urllib.error
import urllib.request

import anthropic

BASE = os.environ["HANGAR_URL"].rstrip("/")
ADMIN_KEY = os.environ.get("HANGAR_ADMIN_KEY")
KEY = os.environ.get("HANGAR_INFERENCE_KEY")
client = anthropic.Anthropic(base_url=BASE, api_key=KEY or "unused", max_retries=0, timeout=120)

TRAINED = "smollm2"
THINKER = "chat-thinking"  # stub with thinking modes; configured, not enabled
SLOW = "chat-slow"  # stub that takes 3 s to load
FORWARDED = "smollm2-server"  # the trained SmolLM2 under a llama-server child
QUESTION = "What is the capital of France? Answer in one word."
# Anthropic's current SDK has no `temperature` argument; Hangar takes it from the body, where
# `extra_body` puts it. Greedy: the same request gives the same text.
GREEDY = {"extra_body": {"temperature": 0}, "max_tokens": 24}


def check(name, fn):
    started = time.monotonic()
    fn()
    print(f"  ok  {name}  ({time.monotonic() - started:.2f}s)", flush=True)


def http(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{BASE}{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    if ADMIN_KEY:
        request.add_header("authorization", f"Bearer {ADMIN_KEY}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def row(model):
    status, body = http("GET", f"/v1/admin/models/{model}")
    assert status == 200, body
    return body


def text(message):
    return "".join(b.text for b in message.content if b.type == "text")


def message():
    m = client.messages.create(model=TRAINED, messages=[{"role": "user", "content": QUESTION}], **GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == TRAINED, m
    assert "Paris" in text(m), m
    assert m.stop_reason == "end_turn" and m.stop_sequence is None, m
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0 and m.usage.output_tokens > 0, m
    return m


def stream():
    whole = text(message())
    with client.messages.stream(model=TRAINED, messages=[{"role": "user", "content": QUESTION}], **GREEDY) as s:
        kinds = [event.type for event in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "content_block_delta" in kinds and "message_delta" in kinds, kinds
    assert text(final) == whole, (text(final), whole)
    assert final.stop_reason == "end_turn", final


def system_and_turns():
    m = client.messages.create(
        model=TRAINED,
        system="You are a geography teacher. Answer in one word.",
        messages=[
            {"role": "user", "content": "What is the capital of Italy?"},
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": [{"type": "text", "text": "And of France?"}]},
        ],
        **GREEDY,
    )
    # The same conversation through the chat route gives the same greedy answer: the system
    # prompt and the turns reach the model's template as they do there.
    chat = {
        "model": TRAINED,
        "max_tokens": 24,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You are a geography teacher. Answer in one word."},
            {"role": "user", "content": "What is the capital of Italy?"},
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "And of France?"},
        ],
    }
    status, body = http("POST", "/v1/chat/completions", chat)
    assert status == 200, body
    assert text(m) == body["choices"][0]["message"]["content"], (m, body)
    assert body["usage"]["prompt_tokens"] == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    # And they are in the prompt: it is longer than the last question alone.
    alone = client.messages.count_tokens(model=TRAINED, messages=[{"role": "user", "content": "And of France?"}])
    used = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert used > alone.input_tokens, (used, alone)


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_round_trip():
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = client.messages.create(
        model=TRAINED, messages=[question], tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=64,
        extra_body={"temperature": 0},
    )
    assert call.stop_reason == "tool_use", call
    use = next(b for b in call.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input.get("city"), str), use
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees and sunny"}
    turns = [question, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(
        model=TRAINED, messages=turns, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=48,
        extra_body={"temperature": 0},
    )
    assert answer.stop_reason != "tool_use" and text(answer).strip(), answer


def stop_sequence():
    said = text(message())
    word = said.split()[-1].strip(".")
    m = client.messages.create(
        model=TRAINED, messages=[{"role": "user", "content": QUESTION}], stop_sequences=["<never>", word], **GREEDY
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word, m
    assert said.startswith(text(m)), (text(m), said)


def structured_output():
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
    m = client.messages.create(
        model=TRAINED,
        messages=[{"role": "user", "content": QUESTION}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
        max_tokens=48,
        extra_body={"temperature": 0},
    )
    assert isinstance(json.loads(text(m))["capital"], str), m


def count_tokens():
    request = {"model": TRAINED, "system": "Be brief.", "messages": [{"role": "user", "content": QUESTION}]}
    counted = client.messages.count_tokens(**request)
    m = client.messages.create(**request, **GREEDY)
    used = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == used, (counted, m.usage)


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


def forwarded():
    whole = text(message())
    m = client.messages.create(model=FORWARDED, messages=[{"role": "user", "content": QUESTION}], **GREEDY)
    assert m.model == FORWARDED and text(m) == whole, (text(m), whole)
    with client.messages.stream(model=FORWARDED, messages=[{"role": "user", "content": QUESTION}], **GREEDY) as s:
        final = s.get_final_message()
    assert text(final) == whole and final.stop_reason == "end_turn", final
    assert final.usage.output_tokens > 0, final


def hang_up():
    long = {"role": "user", "content": "Write a very long story about the sea."}
    with client.messages.stream(model=TRAINED, max_tokens=1500, messages=[long]) as s:
        for event in s:
            if event.type == "content_block_delta":
                break
        assert row(TRAINED)["inflight_requests"] == 1
    deadline = time.monotonic() + 30
    while row(TRAINED)["inflight_requests"] != 0:
        assert time.monotonic() < deadline, "the generation kept running after the client left"
        time.sleep(0.05)


def expect(error_class, status, code, **request):
    try:
        client.messages.create(max_tokens=8, messages=[{"role": "user", "content": "hi"}], **request)
    except error_class as e:
        assert e.status_code == status, (e.status_code, e.body)
        assert e.body["type"] == "error" and e.body["error"]["code"] == code, e.body
        assert e.body["error"]["type"] and e.body["error"]["message"], e.body
        return
    raise AssertionError(f"{request} was answered, not refused with {status} {code}")


def errors():
    expect(anthropic.NotFoundError, 404, "unknown_model", model="no-such-model")
    status, body = http("POST", f"/v1/admin/models/{THINKER}/unload", {})
    assert status == 200, body
    expect(anthropic.InternalServerError, 503, "model_not_loaded", model=THINKER)
    # chat-slow takes 3 s to load; the scripts after this one expect it unloaded (as the
    # demo starts), so it is unloaded again.
    was_loaded = row(SLOW)["runtime_state"] == "loaded"
    if was_loaded:
        assert http("POST", f"/v1/admin/models/{SLOW}/unload", {})[0] == 200
    loading = threading.Thread(target=http, args=("POST", f"/v1/admin/models/{SLOW}/load", {}))
    loading.start()
    deadline = time.monotonic() + 5
    while row(SLOW)["runtime_state"] != "loading":
        assert time.monotonic() < deadline, "chat-slow never started loading"
        time.sleep(0.02)
    expect(anthropic.InternalServerError, 503, "model_loading", model=SLOW)
    loading.join()
    if not was_loaded:
        assert http("POST", f"/v1/admin/models/{SLOW}/unload", {})[0] == 200
    try:
        client.messages.count_tokens(model=FORWARDED, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("count_tokens answered for an engine that cannot count")
    except anthropic.APIStatusError as e:
        assert e.status_code == 501 and e.body["error"]["code"] == "not_implemented", e.body
    expect(anthropic.BadRequestError, 400, "invalid_request", model=TRAINED, extra_body={"temperature": 1.5})


def keys():
    wrong = anthropic.Anthropic(base_url=BASE, api_key="wrong-key", max_retries=0)
    try:
        wrong.messages.create(model=TRAINED, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    except anthropic.PermissionDeniedError as e:
        assert e.body["error"]["type"] == "permission_error", e.body
        return
    raise AssertionError("a wrong x-api-key was accepted")


def main():
    checks = [
        ("message", message),
        ("stream", stream),
        ("system prompt and several turns", system_and_turns),
        ("tool-use round trip (tool_choice any)", tool_round_trip),
        ("stop sequence", stop_sequence),
        ("structured output (output_config.format)", structured_output),
        ("count_tokens equals usage", count_tokens),
        ("thinking on and off (stub)", thinking),
        ("a client that hangs up cancels", hang_up),
        ("llama_server model, through translation", forwarded),
        ("errors in Anthropic's envelope", errors),
    ]
    if KEY:
        checks.append(("x-api-key: a wrong key is refused", keys))
    print(f"anthropic SDK {anthropic.__version__} against {BASE}", flush=True)
    for name, fn in checks:
        check(name, fn)


if __name__ == "__main__":
    main()
