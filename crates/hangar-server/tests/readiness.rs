//! `/readyz`, `/v2/health/ready`: each enabled model that is not serving is named with a
//! typed reason; the ones start-up leaves out by rule do not hold readiness back.

use std::sync::Arc;

use bytes::Bytes;
use hangar_backend::stub::StubBackend;
use hangar_runtime::{Backends, Manager};
use hangar_server::{HangarService, ServerOptions};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

async fn call(s: &HangarService, method: Method, path: &str) -> (u16, Value) {
    let request = Request::builder().method(method).uri(path).body(Full::new(Bytes::new()));
    let response = s.handle(request.unwrap()).await;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `(model, reason, holds_readiness)` of `/readyz`'s `not_serving`.
fn reasons(body: &Value) -> Vec<(String, String, bool)> {
    body["not_serving"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let text = |k: &str| n[k].as_str().unwrap().to_owned();
            (text("model"), text("reason"), n["holds_readiness"].as_bool().unwrap())
        })
        .collect()
}

fn r(model: &str, reason: &str, holds: bool) -> (String, String, bool) {
    (model.to_owned(), reason.to_owned(), holds)
}

#[tokio::test]
async fn readyz_names_each_enabled_model_not_serving_with_its_reason() {
    let config = hangar_config::Config::from_value(&json!({ "models": {
        "a": { "backend": "stub", "enabled": true },
        "b": { "backend": "stub", "enabled": true },
        "broken": { "backend": "stub", "enabled": true, "labels": ["embedding"],
                    "stub": { "fail_load": "simulated: CUDA out of memory" } },
        "off": { "backend": "stub" }
    } }))
    .unwrap();
    let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    let s = HangarService::new(manager.clone(), ServerOptions::default());

    let (status, body) = call(&s, Method::GET, "/readyz").await;
    assert_eq!((status, &body["ready"]), (503, &json!(false)));
    assert_eq!(body["not_loaded"], json!(["a", "broken"]));
    assert_eq!(
        reasons(&body),
        [
            r("a", "start_up_pending", true),
            r("b", "no_slot", false),
            r("broken", "start_up_pending", true)
        ]
    );

    manager.load_enabled().await;
    let (status, body) = call(&s, Method::GET, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["not_loaded"], json!(["broken"]));
    assert_eq!(reasons(&body), [r("b", "no_slot", false), r("broken", "load_failed", true)]);
    let message = body["not_serving"][1]["message"].as_str().unwrap();
    assert!(message.contains("CUDA out of memory"), "{message}");
    // The KServe readiness agrees, and names the model.
    let (status, body) = call(&s, Method::GET, "/v2/health/ready").await;
    assert_eq!(status, 503);
    assert!(body["error"].as_str().unwrap().contains("broken"), "{body}");

    // An operator's unload of a model of start-up's set holds readiness back, named.
    let (status, _) = call(&s, Method::POST, "/v1/admin/models/a/unload").await;
    assert_eq!(status, 200);
    let (_, body) = call(&s, Method::GET, "/readyz").await;
    assert_eq!(
        reasons(&body),
        [r("a", "unloaded", true), r("b", "no_slot", false), r("broken", "load_failed", true)]
    );
}

#[tokio::test]
async fn models_left_out_by_rule_leave_the_server_ready() {
    let config = hangar_config::Config::from_value(&json!({ "models": {
        "a": { "backend": "stub", "enabled": true },
        "b": { "backend": "stub", "enabled": true }
    } }))
    .unwrap();
    let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    let s = HangarService::new(manager.clone(), ServerOptions::default());
    manager.load_enabled().await;
    let (status, body) = call(&s, Method::GET, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((&body["ready"], &body["not_loaded"]), (&json!(true), &json!([])));
    assert_eq!(reasons(&body), [r("b", "no_slot", false)]);
    assert_eq!(call(&s, Method::GET, "/v2/health/ready").await.0, 200);
}

#[tokio::test]
async fn while_keys_are_set_only_key_holders_see_why_a_load_failed() {
    let config = hangar_config::Config::from_value(&json!({ "models": {
        "broken": { "backend": "stub", "enabled": true,
                    "stub": { "fail_load": "cannot open /models/secret/broken.gguf" } }
    } }))
    .unwrap();
    let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    let admin_api_key = Some(hangar_config::Secret::new("admin"));
    let options = ServerOptions { admin_api_key, ..ServerOptions::default() };
    let s = HangarService::new(manager.clone(), options);
    manager.load_enabled().await;
    let (status, body) = call(&s, Method::GET, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(reasons(&body), [r("broken", "load_failed", true)]);
    assert!(!body.to_string().contains("/models/secret"), "{body}");
    let request = Request::get("/readyz").header("authorization", "Bearer admin");
    let response = s.handle(request.body(Full::new(Bytes::new())).unwrap()).await;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    let message = body["not_serving"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("/models/secret/broken.gguf"), "{body}");
}
