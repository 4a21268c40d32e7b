//! The subprocess soak: concurrent chats (streamed and not) against two `llama_server` models
//! while a chaos task loads, unloads, swaps (evicts) them and kills their children with
//! SIGKILL. Invariants checked:
//!
//! 1. every request ends — with a complete answer or an explicit refusal or error (a status
//!    with a JSON `code`, or for a stream an error event): no transport error, no hang (each
//!    request has a 60 s bound, the whole soak a bound too);
//! 2. a stream that started ends with `[DONE]`, an error event before it when it failed;
//! 3. when the soak is over and the models are unloaded, no child of `hangard` is alive.
//!
//! Chaos is driven by a seeded generator, so a failing sequence can be replayed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::engines::llama_server_binary;
use crate::support::{Server, Sse, get, load, post, unload};

/// Codes an admitted-or-refused request may answer with while models come and go.
const EXPLICIT: &[&str] = &[
    "model_not_loaded",
    "model_loading",
    "model_unloading",
    "model_failed",
    "queue_full",
    "backend_crashed",
    "backend_unavailable",
    // Killed three times within the quarantine window (the default `quarantine`): refused
    // until the chaos's next explicit load lifts it.
    "model_quarantined",
];

fn model() -> Value {
    let gguf = format!("{}/../../fixtures/models/tiny-llama.gguf", env!("CARGO_MANIFEST_DIR"));
    json!({
        "backend": "llama_server",
        "model_path": gguf,
        "llama_server_binary_path": llama_server_binary(),
        "llama_server_n_ctx": 2048,
        "target_inflight": 2,
        "llama_server_extra_args": ["--no-webui"],
    })
}

/// A tiny deterministic generator (64-bit LCG).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Children of `pid` (by `/proc/*/stat`'s parent field).
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid …`; comm may contain spaces, so split after the last ')'.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or("");
        if fields.next().and_then(|p| p.parse().ok()) == Some(pid) && state != "Z" {
            children.push(child);
        }
    }
    children
}

/// One client request; `Err` describes a broken invariant.
async fn request(server: &Server, model: &str, stream: bool) -> Result<&'static str, String> {
    let body = json!({
        "model": model, "stream": stream, "max_tokens": 24, "temperature": 0,
        "messages": [{ "role": "user", "content": "Tell me about hangars." }],
    });
    let client = reqwest::Client::new();
    let sent = client.post(server.url("/v1/chat/completions")).json(&body).send();
    let response = tokio::time::timeout(Duration::from_secs(60), sent)
        .await
        .map_err(|_| format!("{model}: no answer within 60 s"))?
        .map_err(|e| format!("{model}: transport error {e}"))?;
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
    if status == 200 && streamed {
        let events =
            tokio::time::timeout(Duration::from_secs(60), Sse::from_response(response).all())
                .await
                .map_err(|_| format!("{model}: a stream did not end within 60 s"))?;
        let last = events.last().map(|e| e.data.clone()).unwrap_or_default();
        if last != "[DONE]" {
            return Err(format!("{model}: a stream ended without [DONE]: {last}"));
        }
        let failed = events.iter().any(|e| e.data.contains("\"error\""));
        return Ok(if failed { "stream_error" } else { "ok" });
    }
    let text = response.text().await.map_err(|e| format!("{model}: body read failed {e}"))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|_| format!("{model}: {status} {text}"))?;
    if status == 200 {
        return if value["object"] == "chat.completion" {
            Ok("ok")
        } else {
            Err(format!("{value}"))
        };
    }
    let code = value["error"]["code"].as_str().unwrap_or_default();
    EXPLICIT
        .iter()
        .find(|c| **c == code)
        .copied()
        .ok_or_else(|| format!("{model}: {status} with unexpected code: {value}"))
}

async fn pid_of(server: &Server, model: &str) -> Option<u32> {
    let (_, row) = get(server, &format!("/v1/admin/models/{model}")).await;
    row["runtime_details"][0]["pid"].as_u64().map(|p| p as u32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_chats_survive_loads_unloads_evictions_and_kills() {
    let settings = json!({
        "max_loaded_models": { "llm": 1 },
        "auto_load": false,
        "models": { "a": model(), "b": model() },
    });
    let server = Server::start(&settings, &[]);
    let (status, row) = load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{row}");
    let soak = Duration::from_secs(15);
    let started = Instant::now();
    let server = Arc::new(server);
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..4u32 {
        let server = Arc::clone(&server);
        clients.spawn(async move {
            let mut tally = BTreeMap::<&str, u32>::new();
            let mut n = 0u32;
            while started.elapsed() < soak {
                let model = if (n + i).is_multiple_of(2) { "a" } else { "b" };
                let at = started.elapsed().as_secs_f64();
                let outcome = match request(&server, model, n.is_multiple_of(3)).await {
                    Ok(outcome) => outcome,
                    // What the server says of the model now, to tell a stuck request apart
                    // from a stuck model.
                    Err(e) => {
                        let (_, row) = get(&server, &format!("/v1/admin/models/{model}")).await;
                        return Err(format!("request sent at +{at:.2} s: {e}\nrow now: {row}"));
                    }
                };
                *tally.entry(outcome).or_default() += 1;
                n += 1;
            }
            Ok::<_, String>(tally)
        });
    }
    let chaos = async {
        let mut rng = Rng(0x5eed);
        let mut ops = Vec::new();
        while started.elapsed() < soak {
            let at = format!("+{:.2} s", started.elapsed().as_secs_f64());
            let model = if rng.below(2) == 0 { "a" } else { "b" };
            match rng.below(4) {
                0 | 1 => {
                    let (status, _) = load(&server, model, json!({})).await;
                    ops.push(format!("{at} load {model}: {status}"));
                }
                2 => {
                    let (status, _) = unload(&server, model).await;
                    ops.push(format!("{at} unload {model}: {status}"));
                }
                _ => {
                    if let Some(pid) = pid_of(&server, model).await {
                        let pid = pid.to_string();
                        let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
                        ops.push(format!("{at} kill -9 {model} ({pid})"));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200 + rng.below(400))).await;
        }
        ops
    };
    let outcome = tokio::time::timeout(Duration::from_secs(180), async {
        let ops = chaos.await;
        (clients.join_all().await, ops)
    })
    .await;
    let (results, ops) = outcome.expect("the soak ends within its bound");
    let mut total = BTreeMap::<&str, u32>::new();
    for result in results {
        let tally = result.unwrap_or_else(|e| panic!("{e}\nchaos: {ops:?}"));
        for (k, v) in tally {
            *total.entry(k).or_default() += v;
        }
    }
    eprintln!("soak outcomes: {total:?}\nchaos: {ops:?}");
    assert!(total.get("ok").copied().unwrap_or(0) > 0, "nothing succeeded: {total:?}");
    assert!(ops.iter().any(|o| o.contains(" kill -9 ")), "the chaos killed nothing: {ops:?}");
    for model in ["a", "b"] {
        let (status, row) = unload(&server, model).await;
        assert_eq!(status, 200, "{row}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = children_of(server.pid());
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "children still alive after unloading all: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Unloaded after the chaos: refused with the state's code, not forwarded anywhere. A
    // model the chaos killed last stays `failed` (an unload of a failed model changes
    // nothing), and one it killed three times in the window is quarantined until its
    // backoff ends, which may happen in between.
    let (_, row) = get(&server, "/v1/admin/models/a").await;
    let quarantined = !row["quarantine"].is_null();
    let state_code = match row["runtime_state"].as_str() {
        Some("failed") => "model_failed",
        _ => "model_not_loaded",
    };
    let chat = json!({ "model": "a", "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = post(&server, "/v1/chat/completions", chat).await;
    let code = body["error"]["code"].as_str().unwrap_or_default();
    let expected = code == state_code || (quarantined && code == "model_quarantined");
    assert!(status == 503 && expected, "{status} {body}; the row: {row}");
}
