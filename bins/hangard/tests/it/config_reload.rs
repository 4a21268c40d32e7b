//! Config reload end to end: the real `hangard` re-reads its config directory on
//! `POST /v1/admin/config/reload` and on `SIGHUP`, and applies the models without a restart:
//! added, removed (gracefully: a running stream finishes), changed (pending while loaded),
//! and an invalid file that changes nothing and reports every problem.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Server, Sse, code, get, load, post, row};

/// A stub chat model that streams a token every `latency_ms`.
fn chat(latency_ms: u64) -> Value {
    json!({ "backend": "stub", "stub": { "token_latency_ms": latency_ms } })
}

fn write(dir: &Path, settings: &Value) {
    std::fs::write(dir.join("settings.json"), serde_json::to_vec_pretty(settings).unwrap())
        .unwrap();
}

async fn names(server: &Server) -> Vec<String> {
    let (status, list) = get(server, "/v1/admin/models").await;
    assert_eq!(status, 200, "{list}");
    list["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().into()).collect()
}

#[tokio::test]
async fn a_reload_by_route_adds_removes_gracefully_changes_and_refuses_an_invalid_file() {
    let slots = json!({ "llm": 4 });
    let settings = json!({ "max_loaded_models": slots, "models": { "a": chat(5), "b": chat(50) } });
    let server = Server::start(&settings, &[]);
    assert_eq!(load(&server, "a", json!({})).await.0, 200);
    assert_eq!(load(&server, "b", json!({})).await.0, 200);
    // A stream on b: 30 tokens, 50 ms each.
    let body = json!({ "model": "b", "stream": true, "max_tokens": 30,
        "messages": [{ "role": "user", "content": "hello" }] });
    let mut stream = Sse::start(&server, "/v1/chat/completions", &body).await;
    let first = stream.next().await.expect("a first chunk");
    assert!(first.data.contains("chat.completion.chunk"), "{}", first.data);

    // b goes, c comes, a changes while loaded, and `max_queue_depth` changes (applied at
    // the next start, not now).
    let changed = json!({ "max_queue_depth": 3, "max_loaded_models": slots,
        "models": { "a": chat(7), "c": chat(5) } });
    write(server.dir(), &changed);
    let (status, answer) = post(&server, "/v1/admin/config/reload", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({ "added": ["c"], "removed": ["b"], "changed": [], "pending": ["a"],
            "restart_required": ["max_queue_depth"] })
    );
    assert_eq!(names(&server).await, ["a", "c"]);
    let (status, gone) = get(&server, "/v1/admin/models/b").await;
    assert_eq!((status, code(&gone)), (404, "unknown_model"));
    // The stream that was running on b finishes in full.
    let events = stream.all().await;
    let finished =
        events.iter().filter(|e| e.data.contains("\"finish_reason\":\"length\"")).count();
    assert_eq!(finished, 1, "the stream ends normally: {:?}", events.last());
    // a serves under its old definition; the row says what waits.
    let a = row(&server, "a").await;
    assert_eq!(a["runtime_state"], "loaded");
    assert_eq!(a["definition"]["stub"]["token_latency_ms"], 5);
    assert_eq!(a["pending_definition"]["changed"], json!(["stub"]), "{a}");
    assert_eq!(a["pending_definition"]["definition"]["stub"]["token_latency_ms"], 7);

    // An invalid file: every problem at once, nothing changes.
    let broken = json!({ "max_loaded_models": slots, "colour": "red",
        "models": { "a": chat(5), "d": { "backend": "stub", "replicas": 0 } } });
    write(server.dir(), &broken);
    let (status, refused) = post(&server, "/v1/admin/config/reload", json!({})).await;
    assert_eq!((status, code(&refused)), (400, "invalid_config"), "{refused}");
    let paths: Vec<&str> = refused["error"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"colour") && paths.contains(&"models.d.replicas"), "{refused}");
    assert_eq!(names(&server).await, ["a", "c"]);
    assert!(row(&server, "a").await["pending_definition"].is_object());

    // Unloaded, a takes its new definition at the next load.
    assert_eq!(post(&server, "/v1/admin/models/a/unload", json!({})).await.0, 200);
    let (status, a) = load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(
        (&a["definition"]["stub"]["token_latency_ms"], &a["pending_definition"]),
        (&json!(7), &Value::Null)
    );
}

#[tokio::test]
async fn sighup_reloads_the_config() {
    let settings = json!({ "models": { "a": chat(5) } });
    let server = Server::start(&settings, &[]);
    write(server.dir(), &json!({ "models": { "a": chat(5), "added-by-hup": chat(5) } }));
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while names(&server).await != ["a", "added-by-hup"] {
        assert!(Instant::now() < deadline, "SIGHUP never added the model: {}", server.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server lives on and serves the new model.
    assert_eq!(load(&server, "added-by-hup", json!({})).await.0, 200);
}
