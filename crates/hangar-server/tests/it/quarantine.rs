//! Crash quarantine through HTTP on the stub engine: a model that keeps crashing or failing
//! to load is refused with 503 `model_quarantined` (`retry_after` and `Retry-After`), its row
//! shows the failures and the quarantine, the backoff doubles while it keeps failing, and an
//! explicit load lifts it.

use std::time::Duration;

use hangar_runtime::{EventKind, Manager};
use hangar_server::HangarService;
use http::Method;
use serde_json::{Value, json};

use crate::support::{metrics, request, row, server};

/// Two failures within a minute quarantine a model for 1 s, then 2 s.
fn service(auto_load: bool) -> (HangarService, Manager) {
    let s = server()
        .settings(json!({
            "auto_load": auto_load,
            "max_loaded_models": { "llm": 1 },
            "quarantine": { "failures": 2, "window_seconds": 60, "backoff_seconds": 1, "max_backoff_seconds": 2 },
        }))
        .models(json!({
            "crashy": { "backend": "stub", "stub": { "crash_after_requests": 1 } },
            "broken": { "backend": "stub", "stub": { "fail_load": "corrupt weights" } },
            "a": { "backend": "stub" },
            "b": { "backend": "stub" },
        }))
        .build();
    let manager = s.manager().clone();
    (s, manager)
}

/// Status, `Retry-After` header and JSON body.
async fn call(
    s: &HangarService,
    method: Method,
    path: &str,
    body: Value,
) -> (u16, Option<String>, Value) {
    let answer = request(method, path).body(body).send(s).await;
    let retry_after = answer.headers.get(http::header::RETRY_AFTER);
    (answer.status, retry_after.map(|v| v.to_str().unwrap().to_owned()), answer.body)
}

async fn chat(s: &HangarService, model: &str) -> (u16, Option<String>, Value) {
    let body = json!({ "model": model, "messages": [{ "role": "user", "content": "hi" }] });
    call(s, Method::POST, "/v1/chat/completions", body).await
}

fn code(body: &Value) -> Option<&str> {
    body["error"]["code"].as_str()
}

/// The model's quarantine and lift events in the journal, in order.
fn quarantine_events(m: &Manager, model: &str) -> Vec<String> {
    m.follow_events(Some((m.events_epoch(), 0)))
        .backlog
        .into_iter()
        .filter(|e| e.model == model)
        .filter_map(|e| match e.kind {
            EventKind::Quarantined { quarantine } => {
                Some(format!("quarantined {}", quarantine.strike))
            }
            EventKind::QuarantineLifted => Some("lifted".into()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_crash_loop_is_quarantined_with_a_growing_backoff_until_an_explicit_load() {
    let (s, m) = service(true);
    // Each request auto-loads the model, which crashes serving it.
    for _ in 0..2 {
        let (status, _, body) = chat(&s, "crashy").await;
        assert_eq!((status, code(&body)), (500, Some("backend_crashed")), "{body}");
    }
    let crashy = row(&s, "crashy").await;
    assert_eq!(crashy["runtime_state"], "failed");
    let kinds: Vec<_> =
        crashy["failures"].as_array().unwrap().iter().map(|f| f["kind"].clone()).collect();
    assert_eq!(kinds, [json!("crashed"), json!("crashed")], "{crashy}");
    assert!(
        crashy["failures"][1]["message"].as_str().unwrap().contains("injected crash"),
        "{crashy}"
    );
    let q = &crashy["quarantine"];
    assert_eq!(
        (q["failures"].as_u64(), q["strike"].as_u64(), q["retry_after_s"].as_u64()),
        (Some(2), Some(1), Some(1)),
        "{crashy}"
    );
    assert_eq!(q["until_unix_ms"].as_u64().unwrap() - q["since_unix_ms"].as_u64().unwrap(), 1000);

    let metrics = metrics(&s).await;
    assert!(metrics.contains("hangar_model_quarantined{model=\"crashy\"} 1"), "{metrics}");
    assert!(metrics.contains("hangar_model_quarantined{model=\"a\"} 0"), "{metrics}");

    // Requests are refused without loading it, with when to come back.
    let (status, retry_after, body) = chat(&s, "crashy").await;
    assert_eq!((status, code(&body)), (503, Some("model_quarantined")), "{body}");
    assert_eq!(
        (retry_after.as_deref(), body["error"]["retry_after"].as_u64()),
        (Some("1"), Some(1))
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains("injected crash"),
        "names the last failure: {body}"
    );
    let lease = json!({ "owner": "job", "ttl_seconds": 60 });
    let (status, _, body) = call(&s, Method::POST, "/v1/admin/models/crashy/leases", lease).await;
    assert_eq!(
        (status, code(&body)),
        (503, Some("model_quarantined")),
        "a lease does not load it: {body}"
    );
    assert_eq!(row(&s, "crashy").await["runtime_state"], "failed", "nothing loaded it");
    assert_eq!(row(&s, "crashy").await["leases"], json!([]), "no lease kept");

    // Once it ends, the next request loads it again; one more crash within the window
    // quarantines it at once, for twice as long.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(row(&s, "crashy").await["quarantine"], Value::Null, "over after 1 s");
    let (status, _, body) = chat(&s, "crashy").await;
    assert_eq!((status, code(&body)), (500, Some("backend_crashed")), "{body}");
    let (status, retry_after, body) = chat(&s, "crashy").await;
    assert_eq!(
        (status, code(&body), retry_after.as_deref()),
        (503, Some("model_quarantined"), Some("2")),
        "{body}"
    );
    assert_eq!(row(&s, "crashy").await["quarantine"]["strike"], 2);

    // An explicit load lifts it: the model loads, the failures stay listed.
    let (status, _, loaded) =
        call(&s, Method::POST, "/v1/admin/models/crashy/load", json!({})).await;
    assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{loaded}");
    assert_eq!(loaded["quarantine"], Value::Null);
    assert_eq!(loaded["failures"].as_array().unwrap().len(), 3);
    assert_eq!(quarantine_events(&m, "crashy"), ["quarantined 1", "quarantined 2", "lifted"]);
}

#[tokio::test]
async fn failed_loads_quarantine_a_model_and_a_lift_starts_counting_afresh() {
    let (s, m) = service(false);
    for _ in 0..2 {
        let (status, _, body) =
            call(&s, Method::POST, "/v1/admin/models/broken/load", json!({})).await;
        assert_eq!((status, code(&body)), (400, Some("load_failed")), "{body}");
    }
    let broken = row(&s, "broken").await;
    assert_eq!(broken["failures"][0]["kind"], "load_failed", "{broken}");
    assert!(broken["failures"][0]["message"].as_str().unwrap().contains("corrupt weights"));
    assert_eq!(broken["quarantine"]["strike"], 1, "{broken}");
    // Without auto-load a request to a failed model gets model_failed; quarantined, it
    // says so and when it ends.
    let (status, retry_after, body) = chat(&s, "broken").await;
    assert_eq!(
        (status, code(&body), retry_after.as_deref()),
        (503, Some("model_quarantined"), Some("1")),
        "{body}"
    );

    // The explicit load lifts the quarantine and runs (and fails again): one failure since
    // the lift, so no quarantine.
    let (status, _, body) = call(&s, Method::POST, "/v1/admin/models/broken/load", json!({})).await;
    assert_eq!((status, code(&body)), (400, Some("load_failed")), "{body}");
    let broken = row(&s, "broken").await;
    assert_eq!(
        (broken["quarantine"].clone(), broken["failures"].as_array().unwrap().len()),
        (Value::Null, 3),
        "{broken}"
    );
    let (status, _, body) = chat(&s, "broken").await;
    assert_eq!((status, code(&body)), (503, Some("model_failed")), "{body}");
    // The multi-model API's load is explicit too: its failure is the second since the lift.
    let (status, _, body) =
        call(&s, Method::POST, "/api/v1/load", json!({ "model_name": "broken" })).await;
    assert_ne!(status, 200, "{body}");
    assert_eq!(row(&s, "broken").await["quarantine"]["strike"], 1);
    assert_eq!(quarantine_events(&m, "broken"), ["quarantined 1", "lifted", "quarantined 1"]);
}

#[tokio::test]
async fn a_load_refused_for_held_models_is_not_the_models_failure() {
    let (s, _) = service(false);
    let lease = json!({ "owner": "job", "ttl_seconds": 60 });
    let (status, _, body) = call(&s, Method::POST, "/v1/admin/models/a/leases", lease).await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..3 {
        let (status, _, body) = call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await;
        assert_eq!((status, code(&body)), (409, Some("slots_pinned")), "{body}");
    }
    let b = row(&s, "b").await;
    assert_eq!((b["failures"].clone(), b["quarantine"].clone()), (json!([]), Value::Null), "{b}");
}
