//! Auth classes, route by route: every operation of `/openapi.json` is called without a
//! key, with a wrong one, with each inference key and with the admin key, and must answer
//! as its class says — and the document must declare that same class.
//!
//! The classes, written here independently of the route table: admin routes
//! (`/v1/admin/…`, `/api/v1/load|unload`, `/v2/repository/…`) take only the admin key;
//! inference routes (the other `/v1/…` routes and `/api/v1/stats`) take an inference key or
//! the admin key; everything else (health, metrics, the document, KServe metadata) is open.

use hangar_server::HangarService;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::support::{request, server};

const ADMIN: &str = "admin-key";
const INFERENCE: [&str; 2] = ["inference-1", "inference-2"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Admin,
    Inference,
    Open,
}

fn class_of(path: &str) -> Class {
    let admin = path.starts_with("/v1/admin/")
        || path.starts_with("/v2/repository/")
        || ["/api/v1/load", "/api/v1/unload"].contains(&path)
        // SGLang's weight-control paths.
        || [
            "/model_info",
            "/pause_generation",
            "/continue_generation",
            "/update_weights_from_disk",
            "/update_weights_from_tensor",
            "/init_weights_update_group",
            "/destroy_weights_update_group",
            "/update_weights_from_distributed",
            "/weights_checker",
        ]
        .contains(&path);
    if admin {
        Class::Admin
    } else if path.starts_with("/v1/") || path == "/api/v1/stats" {
        Class::Inference
    } else {
        Class::Open
    }
}

fn service(admin: Option<&str>, inference: &[&str]) -> HangarService {
    server()
        .models(json!({ "chat": { "backend": "stub", "stub": { "reply": "hi" } } }))
        .admin_key(admin)
        .inference_keys(inference)
        .build()
}

async fn call(s: &HangarService, method: &Method, path: &str, key: Option<&str>) -> (u16, Value) {
    let body = if method == Method::POST { "{}" } else { "" };
    let mut call = request(method.clone(), path).body(body);
    if let Some(key) = key {
        call = call.bearer(key);
    }
    let resp = call.respond(s).await;
    let status = resp.status().as_u16();
    if resp.headers().get("content-type").is_some_and(|t| t == "text/event-stream") {
        // An event stream stays open: the status is the answer.
        return (status, Value::Null);
    }
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Every `(method, path)` the document lists.
async fn operations(s: &HangarService) -> (Value, Vec<(Method, String)>) {
    let (status, doc) = call(s, &Method::GET, "/openapi.json", None).await;
    assert_eq!(status, 200);
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.push((method.to_uppercase().parse().unwrap(), path.clone()));
        }
    }
    (doc, ops)
}

fn refused(status: u16) -> bool {
    status == 401 || status == 403
}

#[tokio::test]
async fn every_route_answers_as_its_class_with_every_kind_of_key() {
    let s = service(Some(ADMIN), &INFERENCE);
    let (doc, ops) = operations(&s).await;
    assert!(ops.len() > 20, "{ops:?}");
    for class in [Class::Admin, Class::Inference, Class::Open] {
        assert!(ops.iter().any(|(_, p)| class_of(p) == class), "no {class:?} route");
    }
    for (method, template) in ops {
        let path = template.replace("{name}", "chat");
        let class = class_of(&template);
        let at = format!("{method} {path} ({class:?})");

        let (status, body) = call(&s, &method, &path, None).await;
        let (wrong, wrong_body) = call(&s, &method, &path, Some("not-a-key")).await;
        if class == Class::Open {
            assert!(!refused(status), "{at}: {status} {body}");
            assert!(!refused(wrong), "{at}: a wrong key on an open route → {wrong}");
        } else {
            // The KServe v2 routes answer their spec's `{"error": "<message>"}`.
            let code = |body: &Value| match &body["error"] {
                Value::String(_) => "v2 envelope".to_owned(),
                error => error["code"].as_str().unwrap_or("none").to_owned(),
            };
            let v2 = path.starts_with("/v2/");
            let (missing, invalid) =
                if v2 { ("v2 envelope", "v2 envelope") } else { ("unauthorized", "forbidden") };
            assert_eq!((status, code(&body).as_str()), (401, missing), "{at}: {body}");
            assert_eq!((wrong, code(&wrong_body).as_str()), (403, invalid), "{at}: {wrong_body}");
        }
        for key in INFERENCE {
            let (status, body) = call(&s, &method, &path, Some(key)).await;
            // An inference key never opens an admin route.
            assert_eq!(status == 403, class == Class::Admin, "{at}: {key} → {status} {body}");
            assert_ne!(status, 401, "{at}");
        }
        let (status, body) = call(&s, &method, &path, Some(ADMIN)).await;
        assert!(!refused(status), "{at}: the admin key → {status} {body}");

        let op = &doc["paths"][template.as_str()][method.as_str().to_lowercase()];
        let expected = match class {
            Class::Admin => json!([{ "bearerAuth": [] }]),
            Class::Inference => json!([{ "inferenceBearerAuth": [] }, { "bearerAuth": [] }]),
            Class::Open => Value::Null,
        };
        assert_eq!(op.get("security").cloned().unwrap_or(Value::Null), expected, "{at}");
    }
}

#[tokio::test]
async fn each_class_is_open_until_it_has_a_key_and_errors_say_which_key() {
    // Inference keys only: admin routes stay open, inference routes need a key.
    let s = service(None, &INFERENCE);
    assert_eq!(call(&s, &Method::GET, "/v1/admin/models", None).await.0, 200);
    let (status, body) = call(&s, &Method::GET, "/v1/models", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("Bearer <inference key>"), "{message}");
    let (status, body) = call(&s, &Method::GET, "/v1/models", Some("nope")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    assert_eq!(call(&s, &Method::GET, "/v1/models", Some(INFERENCE[1])).await.0, 200);

    // The admin key only: inference routes stay open.
    let s = service(Some(ADMIN), &[]);
    assert_eq!(call(&s, &Method::GET, "/v1/models", None).await.0, 200);
    let (status, body) = call(&s, &Method::GET, "/v1/admin/models", Some(INFERENCE[0])).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    let (doc, _) = operations(&s).await;
    assert!(doc["components"]["securitySchemes"].get("inferenceBearerAuth").is_none());
    assert!(doc["paths"]["/v1/models"]["get"].get("security").is_none());
}

#[tokio::test]
async fn a_refused_request_changes_nothing() {
    let s = service(Some(ADMIN), &INFERENCE);
    let (status, _) =
        call(&s, &Method::POST, "/v1/admin/models/chat/load", Some(INFERENCE[0])).await;
    assert_eq!(status, 403);
    let (_, row) = call(&s, &Method::GET, "/v1/admin/models/chat", Some(ADMIN)).await;
    assert_eq!(row["runtime_state"], "unloaded", "{row}");
}
