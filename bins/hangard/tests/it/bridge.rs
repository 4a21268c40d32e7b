//! The Python-bridge engines as clients see them: the real `hangard serve` starting the
//! reference worker under a real interpreter with CTranslate2, on the tiny random-weight CT2
//! fixture (`fixtures/models/tiny-ct2`), driven over HTTP, with the worker processes
//! watched through `/proc`.
//!
//! The interpreter is `HANGAR_BRIDGE_PYTHON` (set by `cargo xtask test`), else
//! `target/bridge-venv/bin/python`; without either these tests fail and say to run
//! `cargo xtask test`. The weights are random, so the text is gibberish: the tests check
//! shapes, token counts, error codes and processes, never the text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{
    Server, Sse, alive, get, load, post, row, temp_dir, unload, wait_for_row, wait_gone, with,
};

/// How long a worker may take to exit once hangard unloads it or ends.
const WORKER_EXIT: Duration = Duration::from_secs(15);

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The bridge interpreter: `HANGAR_BRIDGE_PYTHON`, else the one `cargo xtask test` sets up.
/// Missing, the test fails: these tests are not skipped silently.
fn bridge_python() -> String {
    const HOW: &str = "run `cargo xtask test`, which creates target/bridge-venv with the \
                       bridge worker's packages and sets HANGAR_BRIDGE_PYTHON";
    if let Some(path) = std::env::var_os("HANGAR_BRIDGE_PYTHON") {
        let path = PathBuf::from(path);
        assert!(path.exists(), "HANGAR_BRIDGE_PYTHON={} does not exist; {HOW}", path.display());
        return std::path::absolute(path).unwrap().to_str().unwrap().to_owned();
    }
    let path = workspace().join("target/bridge-venv/bin/python");
    assert!(
        path.exists(),
        "no bridge interpreter: HANGAR_BRIDGE_PYTHON is unset and {} does not exist; {HOW}",
        path.display()
    );
    std::path::absolute(path).unwrap().to_str().unwrap().to_owned()
}

/// The committed CT2 fixture's absolute path.
fn ct2_fixture() -> String {
    let path = workspace().join("fixtures/models/tiny-ct2");
    std::fs::canonicalize(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (cargo xtask fixtures writes it)", path.display()))
        .to_str()
        .unwrap()
        .to_owned()
}

/// The tiny CT2 decoder as a Qwen 3 chat model on the CPU, with `extra` fields.
fn ct2_model(extra: Value) -> Value {
    let model = json!({
        "backend": "ct2",
        "model_path": ct2_fixture(),
        "device": "cpu",
        "prompt_format": "qwen3_template",
        "bridge_python": bridge_python(),
        "ct2_compute_type": "float32",
        "ct2_intra_threads": 1,
        "load_timeout_s": 60,
    });
    with(model, extra)
}

fn config(models: Value) -> Value {
    json!({ "max_loaded_models": { "llm": 4 }, "models": models })
}

/// Loads `model` with `body`, which must succeed; the admin row.
async fn load_ok(server: &Server, model: &str, body: Value) -> Value {
    let (status, row) = load(server, model, body).await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
    row
}

/// The worker pids of a row, one per replica.
fn pids(row: &Value) -> Vec<u32> {
    let details = row["runtime_details"].as_array().unwrap_or_else(|| panic!("{row}"));
    details
        .iter()
        .map(|d| d["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {row}")) as u32)
        .collect()
}

/// Whether `pid` runs (a zombie does not).
fn chat_body(model: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": "Tell me about hangars." }],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// A streamed raw completion that runs long: greedy decoding of this prompt on the fixture
/// meets no end token, so it generates 4,000 tokens (about two seconds).
fn long_stream(model: &str) -> Value {
    json!({ "model": model, "prompt": "A hangar is", "max_tokens": 4000, "temperature": 0, "stream": true })
}

/// The model's log lines, oldest first.
async fn log_lines(server: &Server, model: &str) -> Vec<String> {
    let (status, body) = get(server, &format!("/v1/admin/models/{model}/logs?tail=2000")).await;
    assert_eq!(status, 200, "{body}");
    let lines = body["lines"].as_array().unwrap_or_else(|| panic!("{body}"));
    lines.iter().map(|l| l["line"].as_str().unwrap_or_default().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ct2_model_loads_chats_and_streams_through_the_bridge() {
    let server = Server::start(&config(json!({ "tiny-ct2": ct2_model(json!({})) })), &[]);
    let row = load_ok(&server, "tiny-ct2", json!({})).await;
    let details = &row["runtime_details"][0];
    assert_eq!(details["protocol"], 1, "{row}");
    assert!(details["ctranslate2_version"].is_string(), "the engine's version: {row}");
    assert_eq!(
        row["capabilities"]["thinking_modes"],
        json!(["default", "enabled", "disabled"]),
        "{row}"
    );
    let pid = pids(&row)[0];
    assert!(alive(pid));

    // Non-streamed: a chat completion with its usage.
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("tiny-ct2", 8)).await;
    assert_eq!(status, 200, "{body}");
    let content =
        body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{body}"));
    let usage = &body["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion), "{body}");
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5, "the rendered ChatML prompt: {body}");
    let finish = body["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "length" && completion == 8 || finish == "stop", "{body}");
    assert!(!content.contains('\u{fffd}'), "only whole characters: {content:?}");

    // Streamed: role chunk, content chunks, a finish chunk, [DONE].
    let mut body = chat_body("tiny-ct2", 6);
    body["stream"] = json!(true);
    body["thinking"] = json!("disabled");
    let events = Sse::start(&server, "/v1/chat/completions", &body).await.all().await;
    let (done, chunks) = events.split_last().expect("events");
    assert_eq!(done.data, "[DONE]", "{events:?}");
    let chunks: Vec<Value> = chunks.iter().map(|e| e.json()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "{chunks:?}");
    let content = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
        .count();
    assert!((1..=6).contains(&content), "{chunks:?}");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"].is_string()), "{chunks:?}");

    // The same seed and temperature 0 give the same text (the engine is really deciding).
    let first = post(&server, "/v1/chat/completions", chat_body("tiny-ct2", 12)).await.1;
    let second = post(&server, "/v1/chat/completions", chat_body("tiny-ct2", 12)).await.1;
    assert_eq!(first["choices"][0]["message"], second["choices"][0]["message"]);

    // Unload ends the worker.
    let (status, body) = unload(&server, "tiny-ct2").await;
    assert_eq!(status, 200, "{body}");
    wait_gone(pid, WORKER_EXIT, "the ct2 worker after unload").await;
    let lines = log_lines(&server, "tiny-ct2").await;
    assert!(
        lines.iter().any(|l| l.contains(&format!("pid {pid} exited with status 0"))),
        "a clean exit: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_the_generation_in_the_worker() {
    let server = Server::start(&config(json!({ "tiny-ct2": ct2_model(json!({})) })), &[]);
    load_ok(&server, "tiny-ct2", json!({})).await;
    let mut stream = Sse::start(&server, "/v1/completions", &long_stream("tiny-ct2")).await;
    for _ in 0..3 {
        stream.next().await.expect("an event");
    }
    drop(stream);
    let row = wait_for_row(&server, "tiny-ct2", "its slot back", |r| {
        r["runtime_inflight"] == 0 && r["inflight_requests"] == 0
    })
    .await;
    assert_eq!(row["runtime_state"], "loaded", "{row}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = log_lines(&server, "tiny-ct2").await;
        if lines.iter().any(|l| l.contains("cancelled request")) {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never cancelled: {lines:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The worker serves on.
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("tiny-ct2", 4)).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_worker_moves_the_model_to_failed_with_the_reason() {
    let server = Server::start(&config(json!({ "tiny-ct2": ct2_model(json!({})) })), &[]);
    let pid = pids(&load_ok(&server, "tiny-ct2", json!({})).await)[0];
    let status = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(status.success());
    let row = wait_for_row(&server, "tiny-ct2", "failed", |r| r["runtime_state"] == "failed").await;
    let error = row["last_error"].as_str().unwrap_or_else(|| panic!("{row}"));
    assert!(error.contains("killed by signal 9"), "{row}");
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("tiny-ct2", 4)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("model_failed")), "{body}");
    // It loads again.
    load_ok(&server, "tiny-ct2", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_with_the_engine_package_missing_fails_clearly_and_evicts_nothing() {
    // A bare virtualenv: a real interpreter without ctranslate2.
    let venv = temp_dir("bare-venv");
    let made =
        Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv).status().unwrap();
    assert!(made.success(), "python3 -m venv works");
    let bare = venv.join("bin/python").to_str().unwrap().to_owned();
    let models = json!({
        "resident": { "backend": "stub", "enabled": true },
        "tiny-ct2": ct2_model(json!({ "bridge_python": bare })),
    });
    let mut settings = config(models);
    settings["max_loaded_models"] = json!({ "llm": 1 });
    let server = Server::start(&settings, &[]);
    wait_for_row(&server, "resident", "loaded", |r| r["runtime_state"] == "loaded").await;
    let (status, body) = load(&server, "tiny-ct2", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("load_failed")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ctranslate2") && message.contains(&bare),
        "names the package and the interpreter: {message}"
    );
    assert_eq!(row(&server, "resident").await["runtime_state"], "loaded", "nothing was evicted");
    assert_eq!(row(&server, "tiny-ct2").await["runtime_state"], "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_concurrently_each_in_its_own_worker() {
    let model = ct2_model(json!({ "replica_max": 2 }));
    let server = Server::start(&config(json!({ "tiny-ct2": model })), &[]);
    let loaded = load_ok(&server, "tiny-ct2", json!({ "replicas": 2 })).await;
    let pids = pids(&loaded);
    assert_eq!(pids.len(), 2, "{loaded}");
    assert_ne!(pids[0], pids[1]);
    // One sequence per worker (ct2_inter_threads 1): two running at once are on both.
    assert_eq!(loaded["effective_target_inflight"], 1, "{loaded}");
    let body = long_stream("tiny-ct2");
    let (mut a, mut b) = tokio::join!(
        Sse::start(&server, "/v1/completions", &body),
        Sse::start(&server, "/v1/completions", &body)
    );
    a.next().await.expect("a streams");
    b.next().await.expect("b streams");
    let busy = row(&server, "tiny-ct2").await;
    assert_eq!(
        (busy["runtime_inflight"].as_u64(), busy["queue_depth"].as_u64()),
        (Some(2), Some(0)),
        "{busy}"
    );
    drop((a, b));
    wait_for_row(&server, "tiny-ct2", "both slots back", |r| r["runtime_inflight"] == 0).await;
    let (status, _) = unload(&server, "tiny-ct2").await;
    assert_eq!(status, 200);
    for pid in pids {
        wait_gone(pid, WORKER_EXIT, "a replica's worker after unload").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_outlives_hangard_whether_it_drains_or_is_killed() {
    // SIGTERM: the drain unloads the model, the worker exits on its own.
    let models = json!({ "tiny-ct2": ct2_model(json!({ "enabled": true })) });
    let mut server = Server::start(&config(models.clone()), &[]);
    let loaded =
        wait_for_row(&server, "tiny-ct2", "loaded", |r| r["runtime_state"] == "loaded").await;
    let pid = pids(&loaded)[0];
    server.terminate();
    assert!(server.wait(Duration::from_secs(30)).success(), "hangard drains and exits 0");
    wait_gone(pid, WORKER_EXIT, "the worker after hangard's SIGTERM").await;

    // SIGKILL: hangard cannot clean up; the worker dies with it (its death signal).
    let mut server = Server::start(&config(models), &[]);
    let loaded =
        wait_for_row(&server, "tiny-ct2", "loaded", |r| r["runtime_state"] == "loaded").await;
    let pid = pids(&loaded)[0];
    assert!(alive(pid));
    let status = Command::new("kill").args(["-9", &server.pid().to_string()]).status().unwrap();
    assert!(status.success());
    server.wait(Duration::from_secs(10));
    wait_gone(pid, WORKER_EXIT, "the worker after hangard's SIGKILL").await;
}
