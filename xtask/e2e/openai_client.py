"""hangard through the official `openai` SDK: models, chat (plain and streaming), completions,
responses (plain and streaming), embeddings, reranking (plain HTTP: not in the SDK) and error
answers. Every check runs once per model of a kind: the deterministic stub models of the demo
config and the tiny llama.cpp GGUF models it also enables (random weights, so their text is
gibberish: the checks assert shapes and invariants, not words). Exits non-zero on the first
failed check.

Usage: HANGAR_URL=http://127.0.0.1:PORT python openai_client.py  (demo config)
"""

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request

import openai
from openai import OpenAI

BASE = os.environ["HANGAR_URL"].rstrip("/")
ADMIN_KEY = os.environ.get("HANGAR_ADMIN_KEY")
client = OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0, timeout=60)

# (stub, llama.cpp) per kind, and CTranslate2 through the Python bridge; all enabled in
# fixtures/demo, so loaded at start-up.
CHAT_MODELS = ("chat", "tiny-llama-gguf", "tiny-qwen3-ct2")
# llama.cpp's own llama-server, supervised by Hangar, requests passed through.
FORWARDED_MODEL = "tiny-llama-server"
EMBED_MODELS = ("embed", "tiny-embed-gguf")
RERANK_MODELS = ("rerank", "tiny-rerank-gguf")
# Trained models (cargo xtask fixtures): SmolLM2 in-process and under llama-server, MiniLM.
TRAINED_CHAT = "smollm2"
TRAINED_MODELS = (TRAINED_CHAT, "smollm2-server", "minilm")
ALL_MODELS = CHAT_MODELS + EMBED_MODELS + RERANK_MODELS + (FORWARDED_MODEL,) + TRAINED_MODELS
# CTranslate2 has no per-request seed: its sampling is not repeatable (its admin row's
# runtime_details.seed says "ignored"); greedy decoding is.
SEEDLESS = ("tiny-qwen3-ct2",)

MESSAGES = [{"role": "user", "content": "What is a hangar?"}]
PROMPT = "A hangar is"
MAX_TOKENS = 12
# Greedy decoding: the same request gives the same text, streamed or not.
GREEDY = {"temperature": 0}


def check(name, fn, *args):
    started = time.monotonic()
    fn(*args)
    print(f"  ok  {name}  ({time.monotonic() - started:.2f}s)", flush=True)


def http(method, path, body=None):
    """(status, JSON body) of a plain HTTP request; error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{BASE}{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    if ADMIN_KEY and path.startswith("/v1/admin/"):
        request.add_header("authorization", f"Bearer {ADMIN_KEY}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


# ---------------------------------------------------------------------------------------
# Set-up and the model list
# ---------------------------------------------------------------------------------------


def ensure_loaded():
    """Loads any model of ALL_MODELS that is not loaded (auto_load is off in the demo)."""
    status, body = http("GET", "/v1/admin/models")
    assert status == 200, (status, body)
    loaded = {row["name"] for row in body["models"] if row["is_loaded"]}
    for name in ALL_MODELS:
        if name not in loaded:
            status, body = http("POST", f"/v1/admin/models/{name}/load", {})
            assert status == 200, (name, status, body)
    status, body = http("GET", "/v1/admin/models")
    states = {row["name"]: row["runtime_state"] for row in body["models"]}
    missing = {m: states.get(m) for m in ALL_MODELS if states.get(m) != "loaded"}
    assert not missing, f"not loaded: {missing}"


def models_list():
    ids = [m.id for m in client.models.list().data]
    for wanted in ALL_MODELS:
        assert wanted in ids, f"{wanted} missing from {ids}"
    for wanted in ALL_MODELS:
        assert client.models.retrieve(wanted).id == wanted


# ---------------------------------------------------------------------------------------
# Generation: the same checks for each chat model
# ---------------------------------------------------------------------------------------


def check_usage(usage, finish_reason, max_tokens):
    """Invariants of a generation's token counts, whatever the text."""
    assert usage.prompt_tokens > 0, usage
    assert 0 <= usage.completion_tokens <= max_tokens, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage
    assert finish_reason in ("stop", "length"), finish_reason
    if finish_reason == "length":
        assert usage.completion_tokens == max_tokens, (usage, finish_reason)


def counts(usage):
    """A usage's token counts, without what the prompt cache served (which depends on the
    requests before: a repeated prompt reuses the KV cells its first run left)."""
    return (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


def cached(usage):
    """Prompt tokens the server says it served from its prompt cache."""
    details = usage.prompt_tokens_details
    assert details is not None, usage
    return details.cached_tokens


def chat(model):
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, **GREEDY
    )
    assert reply.object == "chat.completion", reply
    assert reply.id.startswith("chatcmpl-"), reply.id
    assert reply.model == model, reply
    assert len(reply.choices) == 1, reply
    choice = reply.choices[0]
    assert choice.index == 0, reply
    assert choice.message.role == "assistant", reply
    assert isinstance(choice.message.content, str), reply
    check_usage(reply.usage, choice.finish_reason, MAX_TOKENS)
    if reply.usage.completion_tokens > 0:
        assert choice.message.content, reply
    return reply


def chat_completion(model):
    first = chat(model)
    again = chat(model)
    # Deterministic at temperature 0: equal text and equal counts.
    assert again.choices[0].message.content == first.choices[0].message.content, (first, again)
    assert counts(again.usage) == counts(first.usage), (first.usage, again.usage)
    if model == "tiny-llama-gguf":
        # The repeat reuses the prompt's KV cells, all but the last token (whose logits start
        # the answer), and says so in OpenAI's field.
        assert cached(again.usage) == again.usage.prompt_tokens - 1, again.usage
    else:
        assert cached(again.usage) == 0, again.usage
    assert again.id != first.id, "two completions with one id"
    if model in SEEDLESS:
        status, row = http("GET", f"/v1/admin/models/{model}")
        assert row["runtime_details"][0]["seed"].startswith("ignored"), row
        return
    # Sampling with a seed is repeatable too.
    seeded = [
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.9, seed=7
        )
        for _ in range(2)
    ]
    texts = [r.choices[0].message.content for r in seeded]
    assert texts[0] == texts[1], f"seed 7 gave two texts: {texts}"
    check_usage(seeded[0].usage, seeded[0].choices[0].finish_reason, MAX_TOKENS)


def chat_completion_stream(model):
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks, "no chunks"
    assert {c.id for c in chunks} == {chunks[0].id}, "chunks of one stream carry different ids"
    assert chunks[0].id.startswith("chatcmpl-"), chunks[0].id
    assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks), chunks
    # With include_usage the last chunk has no choices and the usage; no other has usage.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    body = chunks[:-1]
    assert all(c.usage is None and len(c.choices) == 1 for c in body), body
    assert body[0].choices[0].delta.role == "assistant", body[0]
    finishes = [c.choices[0].finish_reason for c in body]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None, finishes
    text = "".join(c.choices[0].delta.content or "" for c in body)
    check_usage(last.usage, finishes[-1], MAX_TOKENS)
    # The same request without streaming: the same text, reason and counts.
    reply = chat(model)
    assert text == reply.choices[0].message.content, (text, reply)
    assert finishes[-1] == reply.choices[0].finish_reason, (finishes[-1], reply)
    assert counts(last.usage) == counts(reply.usage), (last.usage, reply.usage)


def completion(model, **extra):
    reply = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, **GREEDY, **extra
    )
    assert reply.object == "text_completion", reply
    assert reply.id.startswith("cmpl-"), reply.id
    assert reply.model == model, reply
    assert len(reply.choices) == 1 and reply.choices[0].index == 0, reply
    check_usage(reply.usage, reply.choices[0].finish_reason, MAX_TOKENS)
    return reply


def completions(model):
    reply = completion(model)
    text = reply.choices[0].text
    if reply.usage.completion_tokens > 0:
        assert text, reply
    echoed = completion(model, echo=True)
    assert echoed.choices[0].text == PROMPT + text, (echoed, text)
    assert counts(echoed.usage) == counts(reply.usage), (echoed.usage, reply.usage)

    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert {c.id for c in chunks} == {chunks[0].id}, "chunks of one stream carry different ids"
    last = chunks[-1]
    assert last.choices == [] and counts(last.usage) == counts(reply.usage), (last, reply.usage)
    streamed = "".join(c.choices[0].text for c in chunks[:-1])
    assert streamed == text, (streamed, text)
    assert chunks[-2].choices[0].finish_reason == reply.choices[0].finish_reason, chunks[-2]


def check_response(response, model, max_output_tokens):
    assert response.object == "response", response
    assert response.id.startswith("resp_"), response.id
    assert response.model == model, response
    usage = response.usage
    assert usage.input_tokens > 0, usage
    assert 0 <= usage.output_tokens <= max_output_tokens, usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens", response
        assert usage.output_tokens == max_output_tokens, usage
    else:
        assert response.status == "completed", response
    assert [item.type for item in response.output] == ["message"], response.output
    message = response.output[0]
    assert message.role == "assistant", message
    assert [part.type for part in message.content] == ["output_text"], message.content
    assert response.output_text == message.content[0].text, response
    if usage.output_tokens > 0:
        assert response.output_text, response


def responses(model):
    response = client.responses.create(
        model=model, input="Say hello.", max_output_tokens=MAX_TOKENS, **GREEDY
    )
    check_response(response, model, MAX_TOKENS)
    return response


def responses_stream(model):
    events = list(
        client.responses.create(
            model=model, input="Say hello.", max_output_tokens=MAX_TOKENS, stream=True, **GREEDY
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)), f"sequence numbers not increasing: {numbers}"
    final = events[-1].response
    check_response(final, model, MAX_TOKENS)
    assert kinds[-1] == f"response.{final.status}", (kinds[-1], final.status)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert done == [deltas] and final.output_text == deltas, (deltas, done, final.output_text)
    # The same request without streaming.
    plain = responses(model)
    assert plain.output_text == deltas, (plain.output_text, deltas)
    pair = lambda u: (u.input_tokens, u.output_tokens, u.total_tokens)  # noqa: E731
    assert pair(plain.usage) == pair(final.usage) and plain.status == final.status, (plain, final)
    if model == "tiny-llama-gguf":
        # The repeat reuses the prompt's KV cells (all but the last token).
        assert plain.usage.input_tokens_details.cached_tokens == plain.usage.input_tokens - 1, plain


# ---------------------------------------------------------------------------------------
# Embeddings and reranking: the same checks for the stub and the llama.cpp model
# ---------------------------------------------------------------------------------------


def close(a, b, tolerance=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b))


def embeddings(model):
    texts = ["first text", "second text", "first text"]
    # The SDK asks for base64 and decodes it; the float form must carry the same numbers.
    result = client.embeddings.create(model=model, input=texts)
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    for r in (result, floats):
        assert r.model == model, r.model
        assert [d.index for d in r.data] == [0, 1, 2], r.data
        assert r.usage.prompt_tokens > 0, r.usage
        assert r.usage.total_tokens == r.usage.prompt_tokens, r.usage
    vectors = [d.embedding for d in result.data]
    dims = {len(v) for v in vectors}
    assert len(dims) == 1 and dims.pop() > 0, dims
    for v in vectors:
        norm = math.sqrt(sum(x * x for x in v))
        assert abs(norm - 1) < 1e-3, f"not L2-normalized: norm {norm}"
    assert not close(vectors[0], vectors[1]), "different texts, equal vectors"
    assert close(vectors[0], vectors[2]), "equal texts, different vectors"
    for a, b in zip(vectors, (d.embedding for d in floats.data)):
        assert close(a, b, 1e-6), "base64 and float encodings differ"
    single = client.embeddings.create(model=model, input=texts[1])
    assert len(single.data) == 1 and close(single.data[0].embedding, vectors[1]), single


def rerank(model):
    documents = ["a boat", "a plane", "a hangar for a plane"]
    request = {"model": model, "query": "plane", "documents": documents}
    status, full = http("POST", "/v1/rerank", {**request, "return_documents": True})
    assert status == 200, (status, full)
    assert full["model"] == model, full
    results = full["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2], results
    scores = [r["relevance_score"] for r in results]
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores), scores
    assert scores == sorted(scores, reverse=True), f"not sorted by relevance: {scores}"
    assert all(r["document"]["text"] == documents[r["index"]] for r in results), results
    assert full["usage"]["prompt_tokens"] > 0, full["usage"]
    status, top = http("POST", "/v1/rerank", {**request, "top_n": 2})
    assert status == 200, (status, top)
    assert [(r["index"], r["relevance_score"]) for r in top["results"]] == [
        (r["index"], r["relevance_score"]) for r in results[:2]
    ], (top, results)
    assert all("document" not in r for r in top["results"]), top


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Structured outputs and tool calls (grammar-constrained on llama.cpp; refused by the stub)
# ---------------------------------------------------------------------------------------

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "sunny": {"type": "boolean"},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 60},
    },
    "required": ["unit", "sunny", "temperature"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["unit", "days"],
        "additionalProperties": False,
    },
}
SAMPLED = {"temperature": 1.0, "max_tokens": 300}


def check_weather(text):
    value = json.loads(text)
    assert set(value) == {"unit", "sunny", "temperature"}, value
    assert value["unit"] in ("celsius", "fahrenheit") and isinstance(value["sunny"], bool), value
    assert isinstance(value["temperature"], int) and -50 <= value["temperature"] <= 60, value


def check_weather_args(arguments):
    value = json.loads(arguments)
    assert set(value) == {"unit", "days"}, value
    assert value["unit"] in ("c", "f") and 1 <= value["days"] <= 7, value


def structured_outputs(model):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "strict": True, "schema": WEATHER_SCHEMA},
    }
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, response_format=response_format, seed=seed, **SAMPLED
        )
        assert reply.choices[0].finish_reason == "stop", reply
        check_weather(reply.choices[0].message.content)
    response = client.responses.create(
        model=model,
        input="Weather?",
        max_output_tokens=300,
        temperature=1.0,
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER_SCHEMA}},
    )
    assert response.status == "completed", response
    check_weather(response.output_text)


def tool_calls(model):
    tools = [{"type": "function", "function": WEATHER_TOOL}]
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=tools, tool_choice="required", seed=1, **SAMPLED
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", reply
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather", call
    check_weather_args(call.function.arguments)

    # Streamed: the SDK's chunks carry the call in a tool_calls delta.
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=tools, seed=2, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **SAMPLED
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0], (finish, calls)
    assert calls[0]["name"] == "get_weather", calls
    check_weather_args(calls[0]["arguments"])

    # The call and its result go back as history.
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    again = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=4)
    assert again.choices[0].message.role == "assistant", again

    # The Responses API: function_call output items.
    response = client.responses.create(
        model=model, input="Weather?", max_output_tokens=300, temperature=1.0,
        tools=[{"type": "function", **WEATHER_TOOL}], tool_choice="required",
    )
    (item,) = response.output
    assert item.type == "function_call" and item.name == "get_weather", response
    check_weather_args(item.arguments)


def constrained_decoding_refused(model):
    expect(
        openai.BadRequestError,
        lambda: client.chat.completions.create(
            model=model, messages=MESSAGES, response_format={"type": "json_object"}
        ),
        "unsupported",
    )


def expect(error, fn, *words):
    """`fn` raises `error` whose message or machine-readable code holds every word."""
    try:
        fn()
    except error as e:
        text = f"{e} {getattr(e, 'code', '')}"
        for word in words:
            assert word in text, (word, text)
    else:
        raise AssertionError(f"expected {error.__name__}")


def unknown_model():
    expect(
        openai.NotFoundError,
        lambda: client.chat.completions.create(model="no-such-model", messages=MESSAGES),
        "no-such-model",
    )
    expect(
        openai.NotFoundError,
        lambda: client.embeddings.create(model="no-such-model", input="x"),
        "no-such-model",
    )


def bad_temperature(model):
    expect(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=model, messages=MESSAGES, temperature=3),
        "temperature",
    )


def wrong_kind(chat_model, embed_model):
    # Refused by the model's type before anything runs (or loads).
    expect(
        openai.BadRequestError,
        lambda: client.embeddings.create(model=chat_model, input="x"),
        "model_type_mismatch",
        "needs a model of type embedding",
    )
    expect(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=embed_model, messages=MESSAGES, max_tokens=1),
        "model_type_mismatch",
        "needs a model of type llm",
    )


def forwarded(model):
    """A llama_server model through the SDK: its answers pass through Hangar unchanged."""
    reply = chat(model)
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True, **GREEDY
        )
    )
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks), chunks
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == reply.choices[0].finish_reason, (finishes, reply)
    assert text == reply.choices[0].message.content, (text, reply)
    status, health = http("GET", "/api/v1/health")
    entry = next(m for m in health["all_models_loaded"] if m["model_name"] == model)
    assert entry["backend_url"].startswith("http://127.0.0.1:"), entry
    status, logs = http("GET", f"/v1/admin/models/{model}/logs?tail=500")
    assert status == 200, logs
    started = [l for l in logs["lines"] if l["stream"] == "hangar" and l["line"].startswith("started pid")]
    assert started and "--alias " + model in started[-1]["line"], started
    assert any(l["stream"] == "stderr" for l in logs["lines"]), "no engine output captured"


def main():
    print(f"openai {openai.__version__} against {BASE}")
    check("all models loaded", ensure_loaded)
    check("models.list + models.retrieve", models_list)
    for model in CHAT_MODELS:
        check(f"[{model}] chat.completions.create (greedy, seeded)", chat_completion, model)
        check(f"[{model}] chat.completions.create(stream=True)", chat_completion_stream, model)
        check(f"[{model}] completions.create (± echo, ± stream)", completions, model)
        check(f"[{model}] responses.create", responses, model)
        check(f"[{model}] responses.create(stream=True)", responses_stream, model)
        check(f"[{model}] temperature 3 -> BadRequestError", bad_temperature, model)
    check(f"[{FORWARDED_MODEL}] chat ± stream passed through, backend_url, logs", forwarded, FORWARDED_MODEL)
    check("[tiny-llama-gguf] structured outputs (json_schema)", structured_outputs, "tiny-llama-gguf")
    check("[tiny-llama-gguf] tool calls (chat ± stream, history, responses)", tool_calls, "tiny-llama-gguf")
    check(f"[{TRAINED_CHAT}, trained] structured outputs (json_schema)", structured_outputs, TRAINED_CHAT)
    check(f"[{TRAINED_CHAT}, trained] tool calls (chat ± stream, history, responses)", tool_calls, TRAINED_CHAT)
    check("[chat] response_format on the stub -> BadRequestError", constrained_decoding_refused, "chat")
    for model in EMBED_MODELS:
        check(f"[{model}] embeddings.create", embeddings, model)
    for model in RERANK_MODELS:
        check(f"[{model}] POST /v1/rerank", rerank, model)
    for chat_model, embed_model in zip(CHAT_MODELS, EMBED_MODELS):
        name = f"[{chat_model}, {embed_model}] wrong model kind -> BadRequestError"
        check(name, wrong_kind, chat_model, embed_model)
    check("unknown model -> NotFoundError", unknown_model)


if __name__ == "__main__":
    main()
    sys.exit(0)
