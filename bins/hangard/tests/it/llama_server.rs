//! The `llama_server` engine (llama.cpp's own `llama-server` as a supervised child) and the
//! `openai_remote` engine as clients see them: the real `hangard serve` starting the real
//! `llama-server` binary on the tiny random-weight GGUF fixtures, driven over HTTP, with the
//! child processes watched through `/proc`.
//!
//! The binary is `HANGAR_LLAMA_SERVER` (set by `cargo xtask test`), else
//! `target/llama-server/llama-server`; without either these tests fail and say to run
//! `cargo xtask llama-server`. The weights are random, so the text is gibberish: the tests
//! check shapes, token counts, error codes and processes, never the text.

mod support;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use support::engines::{Standalone, fixture, llama_server_binary};
use support::{Event, Server, Sse, get, load, post, row, send, temp_dir, unload, wait_for_row};

// ---------------------------------------------------------------------------------------
// Config

/// A `llama_server` model on the fixture `file` with `extra` fields.
fn llama_server(file: &str, extra: Value) -> Value {
    let mut model = json!({
        "backend": "llama_server",
        "model_path": fixture(file),
        "llama_server_binary_path": llama_server_binary(),
        "llama_server_extra_args": ["--no-webui"],
    });
    merge(&mut model, extra);
    model
}

/// The tiny llama chat model (ChatML template in the GGUF) under `llama-server`: a 2,048
/// token context, four parallel slots.
fn chat_model(extra: Value) -> Value {
    let mut model = llama_server(
        "tiny-llama.gguf",
        json!({ "llama_server_n_ctx": 2048, "target_inflight": 4 }),
    );
    merge(&mut model, extra);
    model
}

/// The tiny BERT embedding model under `llama-server --embedding`.
fn embed_model() -> Value {
    llama_server("tiny-embed.gguf", json!({ "labels": ["embedding"] }))
}

fn merge(model: &mut Value, extra: Value) {
    for (key, value) in extra.as_object().expect("an object") {
        model[key] = value.clone();
    }
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

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("no error code in {body}"))
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

/// `(state, ppid, comm)` of a process, from `/proc/<pid>/stat`; `None` when it is gone.
fn proc_stat(pid: u32) -> Option<(char, u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid, comm))
}

/// Whether `pid` runs (a zombie waiting for a parent that does not reap it does not).
fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _, _)| state != 'Z')
}

/// Polls until `pid` no longer runs, failing after `limit`.
async fn wait_gone(pid: u32, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still runs after {limit:?}: {:?}",
            proc_stat(pid)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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

// ---------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread")]
async fn load_chat_stream_embed_and_unload_end_the_child() {
    let models = json!({ "chat": chat_model(json!({})), "embed": embed_model() });
    let server = Server::start(&config(models), &[]);
    let chat_pid = load_ok(&server, "chat", json!({})).await;
    let embed_pid = load_ok(&server, "embed", json!({})).await;
    assert_ne!(chat_pid, embed_pid);
    for pid in [chat_pid, embed_pid] {
        let (_, ppid, comm) = proc_stat(pid).expect("the child runs");
        assert_eq!((ppid, comm.as_str()), (server.pid(), "llama-server"), "a child of hangard");
    }
    let shown = row(&server, "embed").await;
    let command = shown["runtime_details"][0]["command"].as_str().unwrap();
    assert!(command.contains(" --embedding"), "{shown}");
    assert!(
        shown["runtime_details"][0]["backend_url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{shown}"
    );

    // A whole answer: ignore_eos makes it run to max_tokens.
    chat_ok(&server, "chat", 12).await;

    // A stream: role, content, finish, [DONE].
    let mut request = chat_body("chat", 12);
    request["stream"] = true.into();
    let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
    let content = check_chat_stream(&events, "chat");
    assert!(content > 0, "content chunks: {events:?}");

    // Engine output is in hangard's log (INFO) until the engine listens; the per-request
    // lines after that are DEBUG there, and every line stays in the model's log.
    let kept = log_lines(&server, "chat").await;
    assert!(kept.iter().any(|l| text(l).contains("print_timing")), "{kept:?}");
    let logged = server.logs();
    assert!(logged.contains("listening on"), "{logged}");
    assert!(!logged.contains("print_timing"), "{logged}");

    // Two inputs, two vectors of one length.
    let (status, body) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": ["hello", "world"] }))
            .await;
    assert_eq!(status, 200, "{body}");
    let data = body["data"].as_array().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(data.len(), 2, "{body}");
    let lengths: Vec<usize> =
        data.iter().map(|d| d["embedding"].as_array().map_or(0, Vec::len)).collect();
    assert!(lengths[0] > 0 && lengths[0] == lengths[1], "{lengths:?}");

    // Unload ends each child; Hangar logs how it ended.
    for (model, pid) in [("chat", chat_pid), ("embed", embed_pid)] {
        let (status, unloaded) = unload(&server, model).await;
        assert_eq!(
            (status, unloaded["runtime_state"].as_str()),
            (200, Some("unloaded")),
            "{unloaded}"
        );
        assert_eq!(unloaded["runtime_details"], json!([]), "{unloaded}");
        wait_gone(pid, Duration::from_secs(15), model).await;
        let lines = log_lines(&server, model).await;
        let last = lines.last().expect("log lines");
        let line = text(last);
        assert_eq!(last["stream"], "hangar", "{lines:?}");
        assert!(line.starts_with(&format!("pid {pid} ")), "{line}");
        assert!(line.contains("signal 15") || line.contains("status 0"), "{line}");
        assert_eq!(last_start(&lines).map(|(p, _)| p), Some(pid), "{lines:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn load_overrides_change_the_childs_argv() {
    let server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let pid = load_ok(&server, "chat", json!({ "llama_server_n_ctx": 1024 })).await;
    let (started, command) = last_start(&log_lines(&server, "chat").await).expect("a start");
    assert_eq!(started, pid);
    assert!(format!("{command} ").contains(" -c 1024 "), "{command}");
    let shown = row(&server, "chat").await;
    assert_eq!(shown["runtime_details"][0]["command"], command.as_str(), "{shown}");
    assert_eq!(shown["load_override"], json!({ "llama_server_n_ctx": 1024 }), "{shown}");
    chat_ok(&server, "chat", 4).await;

    let (status, body) = unload(&server, "chat").await;
    assert_eq!(status, 200, "{body}");
    // Without a body: the configured context again.
    let (status, body) =
        send(Method::POST, &server.url("/v1/admin/models/chat/load"), None, None).await;
    assert_eq!((status, body["runtime_state"].as_str()), (200, Some("loaded")), "{body}");
    let again = pid_of(&body);
    assert_ne!(again, pid, "a new child");
    let (started, command) = last_start(&log_lines(&server, "chat").await).expect("a start");
    assert_eq!(started, again);
    assert!(format!("{command} ").contains(" -c 2048 "), "{command}");
    assert!(!command.contains(" -c 1024"), "{command}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_child_fails_the_model_and_every_inflight_request() {
    // 8,192 cells: each of the four slots holds a prompt and 1,500 generated tokens.
    let models = json!({ "chat": chat_model(json!({ "llama_server_n_ctx": 8192 })) });
    let server = Server::start(&config(models), &[]);
    let pid = load_ok(&server, "chat", json!({})).await;

    // 1,500 tokens take more than a second on this model (about 1.6 s alone on 2 cores).
    const LONG: u32 = 1500;
    let whole = tokio::spawn({
        let url = server.url("/v1/chat/completions");
        async move { send(Method::POST, &url, Some(&chat_body("chat", LONG)), None).await }
    });
    let mut request = chat_body("chat", LONG);
    request["stream"] = true.into();
    let mut stream = Sse::start(&server, "/v1/chat/completions", &request).await;
    loop {
        let chunk = stream.next().await.expect("the stream runs").json();
        assert!(chunk.get("error").is_none(), "{chunk}");
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            break;
        }
    }
    wait_for_row(&server, "chat", "both requests running", |r| r["runtime_inflight"] == 2).await;
    assert!(!whole.is_finished(), "the non-streamed chat ended before the kill: make it longer");

    kill9(pid);

    // The stream ends with the crash, then [DONE].
    let mut rest = Vec::new();
    while let Some(event) = stream.next().await {
        rest.push(event);
    }
    let (done, rest) = rest.split_last().expect("events after the kill");
    assert_eq!(done.data, "[DONE]", "{rest:?}");
    let (error, chunks) = rest.split_last().expect("an error event");
    let error = error.json();
    assert_eq!(code(&error), "backend_crashed", "{error}");
    assert!(message(&error).contains("signal 9"), "{error}");
    for chunk in chunks {
        assert!(chunk.json().get("error").is_none(), "one error event, the last: {chunk:?}");
    }

    // The whole answer: 500 backend_crashed.
    let (status, body) = whole.await.unwrap();
    assert_eq!((status, code(&body)), (500, "backend_crashed"), "{body}");

    // The model is failed, with the signal in last_error.
    let failed = wait_for_row(&server, "chat", "failed", |r| r["runtime_state"] == "failed").await;
    let last_error = failed["last_error"].as_str().unwrap_or_else(|| panic!("{failed}"));
    assert!(last_error.contains("backend crashed"), "{last_error}");
    assert!(last_error.contains("signal 9"), "{last_error}");
    assert_eq!(failed["runtime_details"], json!([]), "{failed}");
    let (status, refused) = post(&server, "/v1/chat/completions", chat_body("chat", 4)).await;
    assert_eq!((status, code(&refused)), (503, "model_failed"), "{refused}");

    // A new load recovers.
    let again = load_ok(&server, "chat", json!({})).await;
    assert_ne!(again, pid);
    chat_ok(&server, "chat", 4).await;
}

/// `llama-server` queues requests itself: with `target_inflight` 1 (`--parallel 1`) Hangar
/// hands the child two more requests (`dispatch_ahead`), so it never idles between two, and
/// keeps the rest in its own queue, where the admin row counts them.
#[tokio::test(flavor = "multi_thread")]
async fn a_child_is_handed_two_requests_beyond_its_target_and_the_rest_queue_in_hangar() {
    let models = json!({ "chat": chat_model(json!({ "target_inflight": 1 })) });
    let server = Server::start(&config(models), &[]);
    load_ok(&server, "chat", json!({})).await;
    let loaded = row(&server, "chat").await;
    let details = &loaded["runtime_details"][0];
    assert!(details["command"].as_str().unwrap().contains("--parallel 1"), "{loaded}");
    assert_eq!(details["dispatch_ahead"], 2, "{loaded}");
    assert_eq!(loaded["effective_target_inflight"], 1, "{loaded}");

    // Five chats of 1,900 tokens (the 2,048-token context holds the prompt and those), one
    // at a time: while the engine runs the first (0.2-2 s, by the host's load), the row must
    // show three at the engine and two queued.
    const TOKENS: u32 = 1900;
    let chats: Vec<_> = (0..5)
        .map(|_| {
            let url = server.url("/v1/chat/completions");
            tokio::spawn(async move {
                send(Method::POST, &url, Some(&chat_body("chat", TOKENS)), None).await
            })
        })
        .collect();
    let busy = wait_for_row(&server, "chat", "3 at the engine, 2 in Hangar's queue", |r| {
        r["runtime_inflight"] == 3 && r["queue_depth"] == 2
    })
    .await;
    assert_eq!(busy["inflight_requests"], 5, "{busy}");
    for chat in chats {
        let (status, body) = chat.await.unwrap();
        assert_eq!(status, 200, "{body}");
        check_chat(&body, "chat", TOKENS);
    }
    let idle = row(&server, "chat").await;
    assert_eq!(
        (idle["runtime_inflight"].as_u64(), idle["queue_depth"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_never_becomes_ready_fails_at_load_timeout() {
    let server = Server::start(&config(json!({ "stuck": never_ready_model(2) })), &[]);
    let started = Instant::now();
    let (status, body) = load(&server, "stuck", json!({})).await;
    let took = started.elapsed();
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(took >= Duration::from_secs(2), "it waited load_timeout_s: {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let text = message(&body);
    assert!(text.contains("not ready after 2 s"), "{text}");
    assert!(text.contains("loading forever"), "the child's output: {text}");
    let shown = row(&server, "stuck").await;
    assert_eq!(shown["runtime_state"], "failed", "{shown}");
    assert!(shown["last_error"].as_str().unwrap().contains("not ready after 2 s"), "{shown}");

    let (pid, _) = last_start(&log_lines(&server, "stuck").await).expect("a start");
    wait_gone(pid, Duration::from_secs(5), "the never-ready script").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_crashes_at_start_fails_with_its_last_lines() {
    let garbage = temp_dir("garbage").join("x.gguf");
    std::fs::write(&garbage, b"this is not a GGUF file\n".repeat(64)).unwrap();
    let model = llama_server("tiny-llama.gguf", json!({ "model_path": garbage.to_str().unwrap() }));
    let server = Server::start(&config(json!({ "broken": model })), &[]);
    let (status, body) = load(&server, "broken", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("failed to load model"), "{body}");
    let shown = row(&server, "broken").await;
    assert_eq!(shown["runtime_state"], "failed", "{shown}");
    let last_error = shown["last_error"].as_str().unwrap_or_else(|| panic!("{shown}"));
    assert!(last_error.contains("exited"), "{last_error}");
    // llama-server's own words.
    assert!(last_error.contains("failed to load model"), "{last_error}");
    assert!(last_error.contains("x.gguf"), "{last_error}");
    let _ = std::fs::remove_dir_all(garbage.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_hangard_leaves_no_child_alive() {
    // A loaded child.
    let mut server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let pid = load_ok(&server, "chat", json!({})).await;
    assert!(alive(pid));
    kill9(server.pid());
    server.wait(Duration::from_secs(10));
    wait_gone(pid, Duration::from_secs(10), "llama-server after hangard's SIGKILL").await;

    // A child still loading.
    let mut server = Server::start(&config(json!({ "stuck": never_ready_model(60) })), &[]);
    let loading = tokio::spawn({
        let url = server.url("/v1/admin/models/stuck/load");
        async move { reqwest::Client::new().post(url).json(&json!({})).send().await.map(|r| r.status()) }
    });
    let (pid, _) = wait_for_start(&server, "stuck").await;
    assert!(alive(pid));
    let shown = row(&server, "stuck").await;
    assert_eq!(shown["runtime_state"], "loading", "{shown}");
    kill9(server.pid());
    server.wait(Duration::from_secs(10));
    wait_gone(pid, Duration::from_secs(10), "the loading child after hangard's SIGKILL").await;
    let answer = loading.await.unwrap();
    assert!(answer.is_err(), "the load cannot answer: {answer:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_swap_under_concurrent_requests_loses_none() {
    let settings = json!({
        "max_loaded_models": { "llm": 1 },
        "auto_load": true,
        "models": { "a": chat_model(json!({})), "b": chat_model(json!({})) },
    });
    let server = Server::start(&settings, &[]);
    const CLIENTS: usize = 4;
    const EACH: usize = 6;
    const ALLOWED: [&str; 4] =
        ["model_unloading", "model_loading", "queue_full", "model_not_loaded"];
    let url = server.url("/v1/chat/completions");
    let clients = (0..CLIENTS).map(|client| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..EACH {
                let model = if (client + i) % 2 == 0 { "a" } else { "b" };
                let (status, body) =
                    send(Method::POST, &url, Some(&chat_body(model, 16)), None).await;
                answers.push((model, status, body));
            }
            answers
        })
    });
    let clients: Vec<_> = clients.collect();
    // Meanwhile, hangard's llama-server children are counted.
    let hangard = server.pid();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let counting = tokio::spawn(async move {
        let mut most = 0;
        let mut stopped = stopped;
        loop {
            most = most.max(llama_server_children(hangard).len());
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = &mut stopped => return most,
            }
        }
    });
    let answers = tokio::time::timeout(Duration::from_secs(120), async {
        let mut all = Vec::new();
        for client in clients {
            all.extend(client.await.expect("a client task"));
        }
        all
    })
    .await
    .expect("every request answers within 120 s");

    let mut tally: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for (model, status, body) in &answers {
        if *status == 200 {
            check_chat(body, model, 16);
            *tally.entry((model, "200".to_owned())).or_default() += 1;
        } else {
            assert!(!(200..300).contains(status), "{status}: {body}");
            let code = code(body);
            assert!(ALLOWED.contains(&code), "{model}: {status} {body}");
            *tally.entry((model, code.to_owned())).or_default() += 1;
        }
    }
    assert_eq!(answers.len(), CLIENTS * EACH);
    for model in ["a", "b"] {
        assert!(tally.contains_key(&(model, "200".to_owned())), "no 200 for {model}: {tally:?}");
    }
    let _ = stop.send(());
    let most_children = counting.await.unwrap();
    // The models took turns: each load of one evicted the other.
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().expect("metrics text");
    let evictions: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("hangar_model_evictions_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no eviction count: {metrics}"));
    eprintln!("answers: {tally:?}; evictions: {evictions}; most children at once: {most_children}");
    assert!(evictions >= 1, "a swap happened: {tally:?}");
    let children = llama_server_children(server.pid());
    assert!(children.len() <= 1, "llama-server children alive: {children:?}");
    assert!(most_children <= 1, "{most_children} llama-server children ran at once");
}

#[tokio::test]
async fn a_weight_update_swaps_the_child_and_a_failed_one_keeps_the_old_serving() {
    let server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let first = load_ok(&server, "chat", json!({})).await;
    let content =
        |body: Value| body["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let original = content(chat_ok(&server, "chat", 16).await);

    // The same weights with the final norm zeroed: every logit equal, another greedy answer.
    let changed = temp_dir("llama-server-weights").join("tiny-llama.gguf");
    let source = fixture("tiny-llama.gguf");
    let mut bytes = std::fs::read(&source).unwrap();
    let located = hangar_weights::locate_tensors(Path::new(&source)).unwrap();
    let norm = located.iter().find(|t| t.name == "output_norm.weight").expect("output_norm");
    bytes[norm.range.start as usize..norm.range.end as usize].fill(0);
    std::fs::write(&changed, bytes).unwrap();

    let update = json!({ "model_path": changed, "weight_version": "step-1" });
    let (status, updated) =
        post(&server, "/v1/admin/models/chat/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(
        (updated["weight_version"].as_str(), updated["weights_path"].as_str()),
        (Some("step-1"), changed.to_str())
    );
    let second = pid_of(&updated);
    assert_ne!(second, first, "a new child runs the new weights");
    wait_gone(first, Duration::from_secs(10), "the child of the old weights").await;
    let after = content(chat_ok(&server, "chat", 16).await);
    assert_ne!(after, original, "the new weights answer");

    // Weights that do not load: 400 load_failed, the step-1 child keeps serving.
    let bad = json!({ "model_path": "/nonexistent/w.gguf", "weight_version": "step-2" });
    let (status, body) = post(&server, "/v1/admin/models/chat/update-weights-from-disk", bad).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    let r = row(&server, "chat").await;
    assert_eq!((pid_of(&r), r["weight_version"].as_str()), (second, Some("step-1")), "{r}");
    assert_eq!(content(chat_ok(&server, "chat", 16).await), after);
    assert_eq!(llama_server_children(server.pid()), [second], "no child of the failed update");
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_remote_forwards_to_a_real_llama_server() {
    let remote = Standalone::start(&fixture("tiny-llama.gguf"), &["--api-key", "secret123"]).await;
    let base = format!("http://127.0.0.1:{}/v1", remote.port());
    let closed = format!("http://127.0.0.1:{}/v1", free_port());
    let models = json!({
        "remote": { "backend": "openai_remote", "openai_base_url": base, "openai_api_key_env": "REMOTE_KEY_FOR_TEST" },
        "wrong-key": { "backend": "openai_remote", "openai_base_url": base, "openai_api_key_env": "REMOTE_WRONG_KEY" },
        "closed": { "backend": "openai_remote", "openai_base_url": closed, "openai_api_key_env": "REMOTE_KEY_FOR_TEST" },
    });
    let env = [("REMOTE_KEY_FOR_TEST", "secret123"), ("REMOTE_WRONG_KEY", "not-the-key")];
    let server = Server::start_with(&config(models), &[], &env);

    let (status, loaded) = load(&server, "remote", json!({})).await;
    assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{loaded}");
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("remote", 8)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
    assert!(body["usage"]["prompt_tokens"].as_u64() > Some(0), "{body}");
    let shown = row(&server, "remote").await;
    assert!(!shown.to_string().contains("secret123"), "the key leaks into the row: {shown}");
    assert!(
        !loaded.to_string().contains("secret123"),
        "the key leaks into the load answer: {loaded}"
    );

    let (status, body) = load(&server, "wrong-key", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("refused"), "{body}");
    assert!(
        !body.to_string().contains("secret123") && !body.to_string().contains("not-the-key"),
        "{body}"
    );

    let (status, body) = load(&server, "closed", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("unreachable"), "{body}");
    assert_eq!(row(&server, "closed").await["runtime_state"], "failed");
}
