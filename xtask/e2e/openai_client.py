"""hangard through the official `openai` SDK: models, chat (plain and streaming), responses,
embeddings, and the error for an unknown model. Exits non-zero on the first failed check.

Usage: HANGAR_URL=http://127.0.0.1:PORT python openai_client.py  (demo config)
"""

import os
import sys

import openai
from openai import OpenAI

BASE = os.environ["HANGAR_URL"].rstrip("/")
client = OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0, timeout=30)
MESSAGES = [{"role": "user", "content": "What is a hangar?"}]


def check(name, fn):
    fn()
    print(f"  ok  {name}", flush=True)


def models_list():
    ids = [m.id for m in client.models.list().data]
    for wanted in ("chat", "embed", "rerank", "tiny-llama-gguf"):
        assert wanted in ids, f"{wanted} missing from {ids}"


def chat_completion():
    reply = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8)
    choice = reply.choices[0]
    assert choice.message.role == "assistant", reply
    assert choice.message.content, reply
    assert choice.finish_reason in ("stop", "length"), reply
    assert reply.model == "chat", reply
    assert reply.usage.completion_tokens > 0, reply.usage
    return choice.message.content


def chat_completion_stream():
    chunks = list(
        client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, stream=True)
    )
    assert chunks, "no chunks"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text, chunks
    assert finish and finish[-1] in ("stop", "length"), chunks
    # The stub answers equal prompts equally: the stream carries the same text.
    assert text == chat_completion(), (text, "differs from the non-streaming reply")


def responses():
    response = client.responses.create(model="chat", input="Say hello.", max_output_tokens=16)
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens", response
    else:
        assert response.status == "completed", response
    assert response.usage.output_tokens > 0, response.usage
    assert response.output_text, response


def embeddings():
    result = client.embeddings.create(model="embed", input=["first text", "second text"])
    assert len(result.data) == 2, result
    assert [d.index for d in result.data] == [0, 1], result
    dims = {len(d.embedding) for d in result.data}
    assert len(dims) == 1 and dims.pop() > 0, result
    assert result.data[0].embedding != result.data[1].embedding, "different texts, equal vectors"


def unknown_model():
    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=1)
    except openai.NotFoundError as e:
        assert "no-such-model" in str(e), e
    else:
        raise AssertionError("an unknown model was accepted")


def main():
    print(f"openai {openai.__version__} against {BASE}")
    check("models.list", models_list)
    check("chat.completions.create", chat_completion)
    check("chat.completions.create(stream=True)", chat_completion_stream)
    check("responses.create", responses)
    check("embeddings.create", embeddings)
    check("unknown model -> NotFoundError", unknown_model)


if __name__ == "__main__":
    main()
    sys.exit(0)
