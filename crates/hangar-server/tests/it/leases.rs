//! Leases, pins and idle unloads in-process on the stub engine: what keeps a model loaded
//! (never evicted: a load that would need it gone fails with `slots_pinned`), and what
//! unloads a model nobody uses.

use std::time::Duration;

use hangar_server::HangarService;
use http::Method;
use serde_json::{Value, json};

use crate::support::{call, post, row, server};

fn service(extra: Value) -> HangarService {
    server()
        .settings(json!({ "max_loaded_models": { "llm": 1 } }))
        .models(json!({
            "a": { "backend": "stub" },
            "b": { "backend": "stub" },
            "keep": { "backend": "stub", "pinned": true },
            "brief": { "backend": "stub", "idle_unload_seconds": 1 },
        }))
        .settings(extra)
        .build()
}

async fn state(s: &HangarService, model: &str) -> String {
    row(s, model).await["runtime_state"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_lease_loads_the_model_and_keeps_it_from_eviction_until_released() {
    let s = service(json!({}));
    let (status, taken) =
        post(&s, "/v1/admin/models/a/leases", json!({ "owner": "job-7", "ttl_seconds": 600 }))
            .await;
    assert_eq!(status, 200, "{taken}");
    assert_eq!(taken["model"]["runtime_state"], "loaded", "taking a lease loads the model");
    let id = taken["lease"]["id"].as_str().unwrap().to_owned();
    assert_eq!(row(&s, "a").await["leases"][0]["owner"], "job-7");

    // One llm slot, held by the lease: loading b would need a evicted.
    let (status, body) = post(&s, "/v1/admin/models/b/load", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("slots_pinned")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("'b'"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(": a"), "names the holder: {body}");
    assert_eq!(state(&s, "a").await, "loaded", "nothing was evicted");

    // Renew, then release: b loads and evicts a.
    let (status, renewed) =
        post(&s, &format!("/v1/admin/models/a/leases/{id}"), json!({ "ttl_seconds": 30 })).await;
    assert_eq!((status, renewed["ttl_seconds"].as_u64()), (200, Some(30)), "{renewed}");
    let (status, _) =
        call(&s, Method::DELETE, &format!("/v1/admin/models/a/leases/{id}"), Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(row(&s, "a").await["leases"], json!([]));
    let (status, body) = post(&s, "/v1/admin/models/b/load", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(&s, "a").await, "unloaded");

    // A released lease is gone.
    let (status, body) = post(&s, &format!("/v1/admin/models/a/leases/{id}"), json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("lease_not_found")));
}

#[tokio::test]
async fn lease_refusals_are_typed_and_keep_nothing() {
    let s = service(json!({}));
    for body in
        [json!({ "owner": "", "ttl_seconds": 5 }), json!({ "owner": "x", "ttl_seconds": 0 })]
    {
        let (status, answer) = post(&s, "/v1/admin/models/a/leases", body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_load_request")));
    }
    let (status, _) = post(&s, "/v1/admin/models/a/leases", json!({ "owner": "x" })).await;
    assert_eq!(status, 422, "ttl_seconds is required");
    assert_eq!(state(&s, "a").await, "unloaded", "a refused lease loads nothing");
    let (status, _) =
        call(&s, Method::DELETE, "/v1/admin/models/a/leases/lease-99", Value::Null).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_expired_lease_is_dropped_and_the_model_becomes_evictable() {
    let s = service(json!({}));
    let (status, _) =
        post(&s, "/v1/admin/models/a/leases", json!({ "owner": "short", "ttl_seconds": 1 })).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(row(&s, "a").await["leases"], json!([]), "expired leases are not listed");
    let (status, body) = post(&s, "/v1/admin/models/b/load", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(&s, "a").await, "unloaded");
}

#[tokio::test]
async fn a_pinned_model_is_never_evicted() {
    let s = service(json!({}));
    let (status, _) = post(&s, "/v1/admin/models/keep/load", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(row(&s, "keep").await["pinned"], true);
    let (status, body) = post(&s, "/v1/admin/models/a/load", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("slots_pinned")), "{body}");
    assert_eq!(state(&s, "keep").await, "loaded");
    // An explicit unload is the operator's call: it still unloads.
    let (status, _) = post(&s, "/v1/admin/models/keep/unload", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(post(&s, "/v1/admin/models/a/load", json!({})).await.0, 200);
}

#[tokio::test]
async fn an_idle_model_is_unloaded_after_its_timeout_unless_leased() {
    let s = service(json!({ "max_loaded_models": { "llm": 4 } }));
    let (status, row_now) = post(&s, "/v1/admin/models/brief/load", json!({})).await;
    assert_eq!((status, row_now["idle_unload_seconds"].as_u64()), (200, Some(1)));
    let mut unloaded = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if state(&s, "brief").await == "unloaded" {
            unloaded = true;
            break;
        }
    }
    assert!(unloaded, "idle for over 1 s: unloaded");

    // Leased, it stays through several timeouts.
    let (status, _) =
        post(&s, "/v1/admin/models/brief/leases", json!({ "owner": "job", "ttl_seconds": 60 }))
            .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(state(&s, "brief").await, "loaded");
    // A model without a timeout is never unloaded for idleness.
    assert_eq!(row(&s, "a").await["idle_unload_seconds"], Value::Null);
}

#[tokio::test]
async fn unloading_everything_revokes_leases_like_an_explicit_unload() {
    let s = service(json!({}));
    let (status, _) =
        post(&s, "/v1/admin/models/a/leases", json!({ "owner": "job", "ttl_seconds": 600 })).await;
    assert_eq!(status, 200);
    let (status, body) = post(&s, "/api/v1/unload", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let a = row(&s, "a").await;
    assert_eq!((a["runtime_state"].as_str(), a["leases"].clone()), (Some("unloaded"), json!([])));
    // Nothing holds a any more: b may load into the one llm slot after a loads again.
    post(&s, "/v1/admin/models/a/load", json!({})).await;
    let (status, body) = post(&s, "/v1/admin/models/b/load", json!({})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(start_paused = true)]
async fn leases_past_the_cap_answer_429_and_change_nothing() {
    let s = service(json!({ "limits": { "max_leases_per_model": 2 } }));
    let take = |owner: &str| json!({ "owner": owner, "ttl_seconds": 60 });
    let mut ids = Vec::new();
    for owner in ["job-1", "job-2"] {
        let (status, taken) = post(&s, "/v1/admin/models/a/leases", take(owner)).await;
        assert_eq!(status, 200, "{taken}");
        ids.push(taken["lease"]["id"].as_str().unwrap().to_owned());
    }
    let before = row(&s, "a").await;
    let (status, body) = post(&s, "/v1/admin/models/a/leases", take("job-3")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_leases")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_leases_per_model"), "{body}");
    assert_eq!(row(&s, "a").await["leases"], before["leases"], "no lease was added");

    // Released or expired leases make room again.
    let (status, _) =
        call(&s, Method::DELETE, &format!("/v1/admin/models/a/leases/{}", ids[0]), Value::Null)
            .await;
    assert_eq!(status, 200);
    assert_eq!(post(&s, "/v1/admin/models/a/leases", take("job-3")).await.0, 200);
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(post(&s, "/v1/admin/models/a/leases", take("job-4")).await.0, 200);

    // An owner is at most 256 bytes.
    let long = "é".repeat(129);
    let (status, body) = post(&s, "/v1/admin/models/b/leases", take(&long)).await;
    assert_eq!((status, body["error"]["field"].as_str()), (400, Some("owner")), "{body}");
    assert!(row(&s, "b").await["leases"].as_array().unwrap().is_empty());
}
