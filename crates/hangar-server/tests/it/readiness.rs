//! `/readyz`, `/v2/health/ready`: each enabled model that is not serving is named with a
//! typed reason; the ones start-up leaves out by rule do not hold readiness back.

use http::Method;
use serde_json::{Value, json};

use crate::support::{call, get, request, server};

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
    let s = server()
        .models(json!({
            "a": { "backend": "stub", "enabled": true },
            "b": { "backend": "stub", "enabled": true },
            "broken": { "backend": "stub", "enabled": true, "labels": ["embedding"],
                        "stub": { "fail_load": "simulated: CUDA out of memory" } },
            "off": { "backend": "stub" }
        }))
        .build();

    let (status, body) = get(&s, "/readyz").await;
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

    s.manager().load_enabled().await;
    let (status, body) = get(&s, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["not_loaded"], json!(["broken"]));
    assert_eq!(reasons(&body), [r("b", "no_slot", false), r("broken", "load_failed", true)]);
    let message = body["not_serving"][1]["message"].as_str().unwrap();
    assert!(message.contains("CUDA out of memory"), "{message}");
    // The KServe readiness agrees, and names the model.
    let (status, body) = get(&s, "/v2/health/ready").await;
    assert_eq!(status, 503);
    assert!(body["error"].as_str().unwrap().contains("broken"), "{body}");

    // An operator's unload of a model of start-up's set holds readiness back, named.
    let (status, _) = call(&s, Method::POST, "/v1/admin/models/a/unload", "").await;
    assert_eq!(status, 200);
    let (_, body) = get(&s, "/readyz").await;
    assert_eq!(
        reasons(&body),
        [r("a", "unloaded", true), r("b", "no_slot", false), r("broken", "load_failed", true)]
    );
}

#[tokio::test]
async fn models_left_out_by_rule_leave_the_server_ready() {
    let s = server()
        .models(json!({
            "a": { "backend": "stub", "enabled": true },
            "b": { "backend": "stub", "enabled": true }
        }))
        .build();
    s.manager().load_enabled().await;
    let (status, body) = get(&s, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((&body["ready"], &body["not_loaded"]), (&json!(true), &json!([])));
    assert_eq!(reasons(&body), [r("b", "no_slot", false)]);
    assert_eq!(get(&s, "/v2/health/ready").await.0, 200);
    // Each admin row says the same, so a UI needs no second call.
    let (_, rows) = get(&s, "/v1/admin/models").await;
    let row = |name: &str| {
        rows["models"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap().clone()
    };
    assert_eq!(row("a")["not_serving"], Value::Null);
    assert_eq!(row("b")["not_serving"], json!({ "reason": "no_slot", "holds_readiness": false }));
    let (_, b) = get(&s, "/v1/admin/models/b").await;
    assert_eq!(b["not_serving"], row("b")["not_serving"]);
    // Once loaded on demand it serves; unloaded again it is named, still not counted.
    s.manager().load("b", Default::default()).await.unwrap();
    let (_, b) = get(&s, "/v1/admin/models/b").await;
    assert_eq!(b["not_serving"], Value::Null);
    let (_, a) = get(&s, "/v1/admin/models/a").await;
    assert_eq!(a["not_serving"], json!({ "reason": "unloaded", "holds_readiness": true }));
}

#[tokio::test]
async fn while_keys_are_set_only_key_holders_see_why_a_load_failed() {
    let s = server()
        .models(json!({
            "broken": { "backend": "stub", "enabled": true,
                        "stub": { "fail_load": "cannot open /models/secret/broken.gguf" } }
        }))
        .admin_key("admin")
        .build();
    s.manager().load_enabled().await;
    let (status, body) = get(&s, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(reasons(&body), [r("broken", "load_failed", true)]);
    assert!(!body.to_string().contains("/models/secret"), "{body}");
    let body = request(Method::GET, "/readyz").bearer("admin").send(&s).await.body;
    let message = body["not_serving"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("/models/secret/broken.gguf"), "{body}");
}
