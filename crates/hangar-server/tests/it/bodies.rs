//! Property test: arbitrary JSON bodies, for every route that takes one, never make the
//! server panic or fail; every answer is a success or a typed 4xx.
//!
//! The routes and their fields come from the service's own OpenAPI document, so a new route
//! or field is covered without touching this file. Bodies are either any JSON value, or an
//! object made of the route's own field names (the model fields naming configured models)
//! with arbitrary values — shapes that get past parsing and into the handlers' checks.
//!
//! Invariants, for every case:
//! - the service answers (a panic fails the test);
//! - the status is below 500;
//! - a non-2xx answer carries the route group's error envelope with a known `ErrorCode`
//!   (the v2 routes: `{"error": "<message>"}`).

use bytes::Bytes;
use hangar_server::{ErrorBody, HangarService, V2ErrorBody};
use http::Method;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::support::{get, request, server};

const MODELS: [&str; 5] = ["chat", "thinker", "embed", "rerank", "cold"];

fn service(runtime: &tokio::runtime::Runtime) -> HangarService {
    let service = server()
        .settings(json!({ "max_loaded_models": { "llm": 4, "embedding": 2, "reranking": 2 } }))
        .models(json!({
            "chat": { "backend": "stub", "replica_max": 2, "stub": { "reply": "fixed words" } },
            "thinker": { "backend": "stub", "stub": { "thinking": true, "reply": "deep" } },
            "embed": { "backend": "stub", "type": "embedding" },
            "rerank": { "backend": "stub", "type": "reranking" },
            // Not loaded at start; a request loads it (a valid body would otherwise get 503
            // model_not_loaded, by design).
            "cold": { "backend": "stub", "auto_load": true, "stub": { "reply": "cold" } },
        }))
        .loaded(["chat", "thinker", "embed", "rerank"]);
    runtime.block_on(service.start())
}

async fn call(service: &HangarService, path: &str, body: String) -> (u16, Bytes) {
    let answer = request(Method::POST, path)
        .header("content-type", "application/json")
        .body(body)
        .send(service)
        .await;
    (answer.status, answer.raw)
}

/// Every POST route with a JSON body and the names of its top-level fields.
fn body_routes(
    runtime: &tokio::runtime::Runtime,
    service: &HangarService,
) -> Vec<(String, Vec<String>)> {
    let (_, doc) = runtime.block_on(get(service, "/openapi.json"));
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let Some(op) = item.get("post") else { continue };
        let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") else {
            continue;
        };
        let resolved = match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => doc.pointer(r.trim_start_matches('#')).cloned().unwrap_or_default(),
            None => schema.clone(),
        };
        let fields: Vec<String> = resolved["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        let path = path.replace("{name}", "chat");
        routes.push((path, fields));
    }
    assert!(routes.len() >= 10, "expected the body routes of the document, got {routes:?}");
    routes
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        prop::sample::select(MODELS.to_vec()).prop_map(Value::from),
        "[a-z_ ]{0,12}".prop_map(Value::from),
        prop::sample::select(vec!["user", "assistant", "function", "text", "auto", "base64"])
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object of some of `fields` with arbitrary values; `model` / `model_name` name a
/// configured model.
fn shaped(fields: Vec<String>) -> impl Strategy<Value = Value> {
    let n = fields.len().max(1);
    (
        prop::collection::vec((any::<prop::sample::Index>(), any_json()), 0..n),
        prop::sample::select(MODELS.to_vec()),
    )
        .prop_map(move |(picks, model)| {
            let mut object = Map::new();
            for (index, value) in picks {
                if let Some(field) = fields.get(index.index(fields.len().max(1))) {
                    object.insert(field.clone(), value);
                }
            }
            for key in ["model", "model_name"] {
                if fields.iter().any(|f| f == key) {
                    object.insert(key.to_owned(), model.into());
                }
            }
            Value::Object(object)
        })
}

fn check(path: &str, body: &str, status: u16, answer: &Bytes) -> Result<(), TestCaseError> {
    prop_assert!(status < 500, "{path} {body} -> {status}: {}", String::from_utf8_lossy(answer));
    if !(200..300).contains(&status) {
        let typed = if path.starts_with("/v2/") {
            serde_json::from_slice::<V2ErrorBody>(answer).map(drop)
        } else {
            serde_json::from_slice::<ErrorBody>(answer).map(drop)
        };
        prop_assert!(
            typed.is_ok(),
            "{path} {body} -> {status}: not the error envelope: {}",
            String::from_utf8_lossy(answer)
        );
    }
    Ok(())
}

#[test]
fn arbitrary_bodies_get_a_success_or_a_typed_4xx_on_every_route() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let service = service(&runtime);
    for (path, fields) in body_routes(&runtime, &service) {
        let config =
            ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() };
        let strategy = prop_oneof![any_json(), shaped(fields.clone())];
        proptest!(config, |(body in strategy)| {
            let body = body.to_string();
            let (status, answer) = runtime.block_on(call(&service, &path, body.clone()));
            check(&path, &body, status, &answer)?;
        });
        // Bytes that are not JSON at all.
        let (status, answer) = runtime.block_on(call(&service, &path, "{\"model\": ".into()));
        check(&path, "{\"model\": ", status, &answer).unwrap();
        assert_eq!(status, 422, "{path}: a truncated body fails the schema");
    }
}
