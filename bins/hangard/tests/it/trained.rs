//! Trained models served faithfully: SmolLM2-135M-Instruct (Q4_1 GGUF, ChatML template with a
//! default system prompt) through the in-process engine and through a `llama-server` child,
//! next to `llama-server` run alone on the same file; all-MiniLM-L6-v2 (converted to GGUF by
//! `cargo xtask fixtures`) through the in-process engine next to `llama-server --embedding`.
//!
//! The models come from `cargo xtask fixtures` (`cargo xtask test` fetches them first and sets
//! `HANGAR_TRAINED_MODELS`); a plain `cargo test` without them skips these tests loudly.
//!
//! Parity is exact: Hangar links the llama.cpp of `llama-cpp-sys-2` and `llama-server` is built
//! from the `llama-cpp-python` sdist, two llama.cpp versions that neither package lets us pin to
//! one commit, yet their greedy answers agree token for token on these prompts. Should a
//! version bump move them apart, the failure shows each engine's text.

use serde_json::{Value, json};

use crate::support::engines::{Standalone, llama_server_binary, trained};
use crate::support::{Server, post};

const CHAT: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const EMBED: &str = "all-MiniLM-L6-v2.F32.gguf";

/// The prompts of the parity test, each with a word its answer must hold (a fact the model
/// gets right).
const FACTS: [(&str, &str); 3] = [
    ("What is the capital of France? Answer in one word.", "Paris"),
    ("How many days are in a week?", "7"),
    ("Name the opposite of hot.", "cold"),
];
const OPEN: [&str; 2] =
    ["Write a haiku about the sea.", "Explain what a CPU does in two sentences."];

/// A server with the chat model in-process (`inproc`, four sequences) and, with `child`,
/// through a `llama-server` child too (`child`, four slots), loaded at start-up; returned
/// once ready.
async fn chat_server(path: &str, child: bool) -> Server {
    let mut models = json!({
        "inproc": {
            "backend": "llama_cpp", "model_path": path, "enabled": true,
            "target_inflight": 4, "gguf_n_ctx": 4096,
        },
    });
    if child {
        models["child"] = json!({
            "backend": "llama_server", "model_path": path, "enabled": true,
            "llama_server_binary_path": llama_server_binary(),
            "llama_server_n_ctx": 16384, "target_inflight": 4,
            "llama_server_extra_args": ["--no-webui"],
        });
    }
    let server =
        Server::start(&json!({ "max_loaded_models": { "llm": 2 }, "models": models }), &[]);
    ready(&server).await;
    server
}

/// `llama-server` alone on the chat model: one slot, the context of `inproc`'s sequences.
async fn alone(path: &str) -> Standalone {
    Standalone::start(path, &["-c", "4096", "-np", "1"]).await
}

async fn ready(server: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !reqwest::get(server.url("/readyz")).await.is_ok_and(|r| r.status() == 200) {
        assert!(std::time::Instant::now() < deadline, "not ready:\n{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// POSTs `body` to `url` and returns the JSON answer (which must be 200).
async fn answer(url: &str, body: &Value) -> Value {
    let response = reqwest::Client::new().post(url).json(body).send().await.expect("answers");
    let status = response.status().as_u16();
    let value: Value = response.json().await.expect("JSON");
    assert_eq!(status, 200, "{url}: {value}");
    value
}

fn chat(model: &str, messages: Value, extra: Value) -> Value {
    let mut body = json!({ "model": model, "messages": messages });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

fn content(answer: &Value) -> String {
    answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn greedy_answers_are_right_and_agree_with_llama_server_alone_through_each_engine() {
    let Some(path) = trained(CHAT) else { return };
    let alone = alone(&path).await;
    let server = chat_server(&path, true).await;
    let greedy = json!({ "temperature": 0, "max_tokens": 48 });
    let prompts = FACTS.iter().map(|(p, _)| *p).chain(OPEN);
    for (i, prompt) in prompts.enumerate() {
        let reference = content(
            &answer(&alone.url("/v1/chat/completions"), &chat("x", user(prompt), greedy.clone()))
                .await,
        );
        for model in ["inproc", "child"] {
            let body = chat(model, user(prompt), greedy.clone());
            let text = content(&answer(&server.url("/v1/chat/completions"), &body).await);
            assert_eq!(
                text, reference,
                "{model} on {prompt:?}: Hangar {text:?}, llama-server {reference:?}"
            );
            if let Some((_, word)) = FACTS.get(i) {
                assert!(text.contains(word), "{model} on {prompt:?} answered {text:?}, not {word}");
            }
        }
    }
}

/// `prompt_format: auto` renders the GGUF's own Jinja template as `llama-server` does
/// (`/apply-template`): the rendered chat and `llama-server`'s text as a raw prompt give the
/// same prompt tokens and the same greedy answer, for a plain chat (where SmolLM2's template
/// adds its default system prompt), an own system prompt, and several turns.
#[tokio::test(flavor = "multi_thread")]
async fn auto_renders_the_chat_as_llama_server_renders_it() {
    let Some(path) = trained(CHAT) else { return };
    let alone = alone(&path).await;
    let server = chat_server(&path, false).await;
    let chats = [
        ("plain", user("Hi there!")),
        (
            "system",
            json!([
                { "role": "system", "content": "You answer like a pirate." },
                { "role": "user", "content": "Where is the treasure?" },
            ]),
        ),
        (
            "multi-turn",
            json!([
                { "role": "user", "content": "My name is Ada." },
                { "role": "assistant", "content": "Nice to meet you, Ada!" },
                { "role": "user", "content": "What is my name?" },
            ]),
        ),
    ];
    let greedy = json!({ "temperature": 0, "max_tokens": 24 });
    for (label, messages) in chats {
        let rendered =
            answer(&alone.url("/apply-template"), &json!({ "messages": messages })).await;
        let text = rendered["prompt"].as_str().expect("a prompt").to_owned();
        if label == "plain" {
            assert!(text.contains("You are a helpful AI assistant named SmolLM"), "{text}");
        }
        let via_chat =
            answer(&server.url("/v1/chat/completions"), &chat("inproc", messages, greedy.clone()))
                .await;
        let mut raw = json!({ "model": "inproc", "prompt": text });
        raw["temperature"] = json!(0);
        raw["max_tokens"] = json!(24);
        let via_text = answer(&server.url("/v1/completions"), &raw).await;
        assert_eq!(
            via_chat["usage"]["prompt_tokens"], via_text["usage"]["prompt_tokens"],
            "{label}: llama-server renders {text:?}"
        );
        assert_eq!(
            content(&via_chat),
            via_text["choices"][0]["text"].as_str().unwrap(),
            "{label}: {text:?}"
        );
    }
}

/// Without sampling fields the in-process engine samples (`llama-server`'s defaults): a chat
/// with a fixed seed ends by itself within 200 tokens, alone and four at once; two unseeded
/// runs differ; two `temperature: 0` runs agree.
#[tokio::test(flavor = "multi_thread")]
async fn default_sampling_ends_by_itself_and_is_not_greedy() {
    let Some(path) = trained(CHAT) else { return };
    let server = chat_server(&path, false).await;
    let url = server.url("/v1/chat/completions");
    let seeded = chat(
        "inproc",
        user("Say hello in one short sentence."),
        json!({ "seed": 42, "max_tokens": 200 }),
    );
    let check = |answer: &Value| {
        assert_eq!(answer["choices"][0]["finish_reason"], "stop", "ran to max_tokens: {answer}");
        assert!(!content(answer).trim().is_empty(), "{answer}");
    };
    let alone = answer(&url, &seeded).await;
    check(&alone);
    let four = futures_join4(&url, &seeded).await;
    four.iter().for_each(check);

    let open =
        chat("inproc", user("Write a short poem about the sea."), json!({ "max_tokens": 48 }));
    let (a, b) = (answer(&url, &open).await, answer(&url, &open).await);
    assert_ne!(content(&a), content(&b), "two unseeded answers agree: not sampled");
    let greedy = chat(
        "inproc",
        user("Write a short poem about the sea."),
        json!({ "max_tokens": 48, "temperature": 0 }),
    );
    let (a, b) = (answer(&url, &greedy).await, answer(&url, &greedy).await);
    assert_eq!(content(&a), content(&b), "temperature 0 is greedy");
}

async fn futures_join4(url: &str, body: &Value) -> Vec<Value> {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (url, body) = (url.to_owned(), body.clone());
            tokio::spawn(async move { answer(&url, &body).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a request task"));
    }
    answers
}

/// A long multi-turn chat's second turn reuses the first turn's prefix (reported as cached
/// tokens) and answers as a fresh context does (the same model reloaded).
#[tokio::test(flavor = "multi_thread")]
async fn the_second_turn_reuses_the_prefix_and_answers_as_a_fresh_context() {
    let Some(path) = trained(CHAT) else { return };
    let server = chat_server(&path, false).await;
    let url = server.url("/v1/chat/completions");
    let story = "The hangar at the edge of the airfield held three planes: a red biplane, a silver \
                 jet and a yellow glider. Every morning the mechanic checked the biplane first. ";
    let mut messages =
        vec![json!({ "role": "user", "content": story.repeat(6) + "Which plane is red?" })];
    let greedy = json!({ "temperature": 0, "max_tokens": 32 });
    let first = answer(&url, &chat("inproc", json!(messages), greedy.clone())).await;
    messages.push(json!({ "role": "assistant", "content": content(&first) }));
    messages.push(json!({ "role": "user", "content": "And which one is silver?" }));
    let second = answer(&url, &chat("inproc", json!(messages), greedy.clone())).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached * 2 > prompt, "cached {cached} of {prompt} prompt tokens");
    let (status, body) = post(&server, "/v1/admin/models/inproc/unload", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(&server, "/v1/admin/models/inproc/load", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let fresh = answer(&url, &chat("inproc", json!(messages), greedy)).await;
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{fresh}");
    assert_eq!(content(&second), content(&fresh), "cached and fresh contexts answer alike");
    assert!(content(&fresh).to_lowercase().contains("jet"), "{}", content(&fresh));
}

/// Paraphrases score well above unrelated sentences, and the in-process engine's vectors are
/// `llama-server --embedding`'s on the same GGUF to 1e-4.
#[tokio::test(flavor = "multi_thread")]
async fn embeddings_rank_paraphrases_first_and_match_llama_server() {
    let Some(path) = trained(EMBED) else { return };
    let alone = Standalone::start(&path, &["--embedding"]).await;
    let settings = json!({ "models": { "minilm": {
        "backend": "llama_cpp", "model_path": path, "enabled": true, "labels": ["embedding"],
    } } });
    let server = Server::start(&settings, &[]);
    ready(&server).await;
    let input = [
        "A man is playing a guitar.",
        "Someone plays an acoustic guitar.",
        "The stock market fell sharply today.",
    ];
    let vectors = |body: Value| -> Vec<Vec<f64>> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| serde_json::from_value(d["embedding"].clone()).unwrap())
            .collect()
    };
    let ours = vectors(
        answer(&server.url("/v1/embeddings"), &json!({ "model": "minilm", "input": input })).await,
    );
    let theirs = vectors(answer(&alone.url("/v1/embeddings"), &json!({ "input": input })).await);
    let cos = |a: &[f64], b: &[f64]| {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt()
            * b.iter().map(|x| x * x).sum::<f64>().sqrt())
    };
    let (close, far) = (cos(&ours[0], &ours[1]), cos(&ours[0], &ours[2]));
    assert!(close > 0.6 && close - far > 0.4, "paraphrase {close:.3}, unrelated {far:.3}");
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.len(), 384);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "input {i}: largest difference {worst:e}");
    }
}
