//! The `llama_server` engine (llama.cpp's own `llama-server` as a supervised child) and the
//! `openai_remote` engine as clients see them: the real `hangard serve` starting the real
//! `llama-server` binary on the tiny random-weight GGUF fixtures, driven over HTTP, with the
//! child processes watched through `/proc`.
//!
//! The binary is `HANGAR_LLAMA_SERVER` (set by `cargo xtask test`), else
//! `target/llama-server/llama-server`; without either these tests fail and say to run
//! `cargo xtask llama-server`. The weights are random, so the text is gibberish: the tests
//! check shapes, token counts, error codes and processes, never the text.

mod concurrency;
mod failures;
mod lifecycle;
mod remote;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::engines::{Standalone, fixture, llama_server_binary};
use crate::support::{
    Event, Server, Sse, alive, code, get, load, post, proc_stat, row, send, temp_dir, unload,
    wait_for_row, wait_gone, with,
};

// ---------------------------------------------------------------------------------------
// Config

/// A `llama_server` model on the fixture `file` with `extra` fields.
fn llama_server(file: &str, extra: Value) -> Value {
    let model = json!({
        "backend": "llama_server",
        "model_path": fixture(file),
        "llama_server_binary_path": llama_server_binary(),
        "llama_server_extra_args": ["--no-webui"],
    });
    with(model, extra)
}

/// The tiny llama chat model (ChatML template in the GGUF) under `llama-server`: a 2,048
/// token context, four parallel slots.
fn chat_model(extra: Value) -> Value {
    let model = llama_server(
        "tiny-llama.gguf",
        json!({ "llama_server_n_ctx": 2048, "target_inflight": 4 }),
    );
    with(model, extra)
}

/// The tiny BERT embedding model under `llama-server --embedding`.
fn embed_model() -> Value {
    llama_server("tiny-embed.gguf", json!({ "labels": ["embedding"] }))
}

/// A config of `models` with room for all of them at once.
fn config(models: Value) -> Value {
    json!({
        "max_loaded_models": { "llm": 8, "embedding": 2, "reranking": 2 },
        "models": models,
    })
}

/// An executable shell script `body` in a fresh directory (the directory is left behind
/// for the OS's temp cleaner; it holds a few bytes).
fn script(label: &str, body: &str) -> String {
    let path = temp_dir(label).join("fake-llama-server");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A model whose "llama-server" prints one line and never listens.
fn never_ready_model(load_timeout_s: u32) -> Value {
    json!({
        "backend": "llama_server",
        "model_path": fixture("tiny-llama.gguf"),
        "llama_server_binary_path": script("never-ready", "echo \"loading forever\"\nexec sleep 600"),
        "load_timeout_s": load_timeout_s,
    })
}

// ---------------------------------------------------------------------------------------
// HTTP helpers

/// Loads `model` with `body`, which must succeed; the child's pid.
async fn load_ok(server: &Server, model: &str, body: Value) -> u32 {
    let (status, row) = load(server, model, body).await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
    pid_of(&row)
}

/// The pid of replica 0's child in an admin row.
fn pid_of(row: &Value) -> u32 {
    let details = row["runtime_details"].as_array().unwrap_or_else(|| panic!("{row}"));
    assert_eq!(details.len(), 1, "one replica: {row}");
    let pid = details[0]["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {row}"));
    assert!(pid > 0, "{row}");
    u32::try_from(pid).unwrap()
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_else(|| panic!("no error message in {body}"))
}

/// A chat request; `ignore_eos` makes llama-server generate exactly `max_tokens`.
fn chat_body(model: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": "Tell me about hangars." }],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// A non-streamed chat that must succeed and generate exactly `max_tokens`.
async fn chat_ok(server: &Server, model: &str, max_tokens: u32) -> Value {
    let (status, body) = post(server, "/v1/chat/completions", chat_body(model, max_tokens)).await;
    assert_eq!(status, 200, "{body}");
    check_chat(&body, model, max_tokens);
    body
}

fn check_chat(body: &Value, model: &str, max_tokens: u32) {
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert_eq!(body["model"], model, "{body}");
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(1), "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant", "{body}");
    assert!(choice["message"]["content"].is_string(), "{body}");
    assert_eq!(choice["finish_reason"], "length", "{body}");
    let usage = &body["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("{body}"));
    assert!(prompt > 0, "{body}");
    assert_eq!(usage["completion_tokens"].as_u64(), Some(u64::from(max_tokens)), "{body}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + u64::from(max_tokens)), "{body}");
}

/// The model's log lines (`{timestamp, replica, stream, line}`), oldest first.
async fn log_lines(server: &Server, model: &str) -> Vec<Value> {
    let (status, body) = get(server, &format!("/v1/admin/models/{model}/logs?tail=2000")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], model, "{body}");
    body["lines"].as_array().unwrap_or_else(|| panic!("{body}")).clone()
}

/// The last "started pid N: <command line>" line of the model's log: `(N, command line)`.
fn last_start(lines: &[Value]) -> Option<(u32, String)> {
    lines.iter().rev().find_map(|l| {
        if l["stream"] != "hangar" {
            return None;
        }
        let rest = l["line"].as_str()?.strip_prefix("started pid ")?;
        let (pid, command) = rest.split_once(": ")?;
        Some((pid.parse().ok()?, command.to_owned()))
    })
}

/// Polls the model's log until a child was started; `(pid, command line)`.
async fn wait_for_start(server: &Server, model: &str) -> (u32, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = log_lines(server, model).await;
        if let Some(start) = last_start(&lines) {
            return start;
        }
        assert!(Instant::now() < deadline, "{model} started no child: {lines:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn text(line: &Value) -> &str {
    line["line"].as_str().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Processes

/// The running `llama-server` children of `parent`.
fn llama_server_children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((state, ppid, comm)) = proc_stat(pid)
            && ppid == parent
            && comm == "llama-server"
            && state != 'Z'
        {
            found.push(pid);
        }
    }
    found
}

/// `kill -9 pid`.
fn kill9(pid: u32) {
    let status = Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill -9 {pid} failed");
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------------------
// Streams

/// The events of a chat stream that ended normally: JSON chunks, then `[DONE]`. Checks the
/// framing: a first chunk with the assistant's role, content chunks, one finish chunk after
/// the content; returns the content chunks' count.
fn check_chat_stream(events: &[Event], model: &str) -> usize {
    let (done, events) = events.split_last().expect("events");
    assert_eq!(done.data, "[DONE]", "the last event is [DONE]: {events:?}");
    let chunks: Vec<Value> = events.iter().map(Event::json).collect();
    assert!(!chunks.is_empty(), "chunks before [DONE]");
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["role"], "assistant",
        "a role chunk first: {}",
        chunks[0]
    );
    let mut content = 0;
    let mut finish = None;
    for chunk in &chunks {
        assert!(chunk.get("error").is_none(), "{chunk}");
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert_eq!(chunk["model"], model, "{chunk}");
        let Some(choice) = chunk["choices"].get(0) else { continue };
        if choice["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            assert!(finish.is_none(), "content after the finish chunk: {chunk}");
            content += 1;
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert!(finish.is_none(), "two finish chunks: {chunk}");
            finish = Some(reason.to_owned());
        }
    }
    assert_eq!(finish.as_deref(), Some("length"), "a finish chunk: {chunks:?}");
    content
}
