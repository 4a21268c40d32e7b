//! `GET /openapi.json` and `GET /metrics`, in process through `HangarService::handle`.

use std::collections::BTreeSet;

use hangar_server::HangarService;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{request, server};

/// Every route of the service, written out independently of the route table.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/admin/models"),
    ("GET", "/v1/admin/models/{name}"),
    ("GET", "/v1/admin/models/{name}/logs"),
    ("GET", "/v1/admin/events"),
    ("POST", "/v1/admin/models/{name}/load"),
    ("POST", "/v1/admin/models/{name}/unload"),
    ("GET", "/v1/admin/gpu-memory"),
    ("POST", "/v1/admin/config/reload"),
    ("POST", "/v1/admin/models/{name}/leases"),
    ("POST", "/v1/admin/models/{name}/leases/{id}"),
    ("DELETE", "/v1/admin/models/{name}/leases/{id}"),
    ("POST", "/v1/admin/models/{name}/pause"),
    ("POST", "/v1/admin/models/{name}/continue"),
    ("POST", "/v1/admin/models/{name}/sleep"),
    ("POST", "/v1/admin/models/{name}/wake"),
    ("POST", "/v1/admin/models/{name}/update-weights-from-disk"),
    ("POST", "/v1/admin/models/{name}/weights-checker"),
    ("GET", "/model_info"),
    ("POST", "/model_info"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/update_weights_from_disk"),
    ("GET", "/weights_checker"),
    ("POST", "/weights_checker"),
    ("POST", "/update_weights_from_tensor"),
    ("POST", "/init_weights_update_group"),
    ("POST", "/destroy_weights_update_group"),
    ("POST", "/update_weights_from_distributed"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{name}"),
    ("GET", "/api/v1/health"),
    ("GET", "/api/v1/stats"),
    ("POST", "/api/v1/load"),
    ("POST", "/api/v1/unload"),
    ("GET", "/v2"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/{name}"),
    ("GET", "/v2/models/{name}/ready"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/{name}/load"),
    ("POST", "/v2/repository/models/{name}/unload"),
    ("GET", "/metrics"),
    ("GET", "/metrics/node"),
    ("GET", "/openapi.json"),
    ("GET", "/ui"),
    ("GET", "/ui/{name}"),
    ("GET", "/healthz"),
    ("GET", "/health"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("GET", "/readyz"),
];

/// Methods an OpenAPI path item may hold operations under.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

fn service() -> HangarService {
    service_with_key(None)
}

fn service_with_key(admin_api_key: Option<&str>) -> HangarService {
    server()
        .models(json!({
            "chat": { "backend": "stub" },
            "bge": { "backend": "stub", "labels": ["embedding"] }
        }))
        .admin_key(admin_api_key)
        .build()
}

/// Status, content type and body text.
async fn call(
    service: &HangarService,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, String, String) {
    let answer = request(method, path)
        .header(header::CONTENT_TYPE.as_str(), "application/json")
        .body(body)
        .send(service)
        .await;
    let content_type = answer.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let content_type = content_type.unwrap_or_default().to_owned();
    let status = StatusCode::from_u16(answer.status).unwrap();
    (status, content_type, String::from_utf8(answer.raw.to_vec()).expect("UTF-8 body"))
}

async fn document() -> Value {
    document_of(&service()).await
}

async fn document_of(service: &HangarService) -> Value {
    let (status, content_type, body) = call(service, Method::GET, "/openapi.json", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(content_type.starts_with("application/json"), "{content_type}");
    serde_json::from_str(&body).expect("the document is JSON")
}

/// Every (method, path, operation) of the document.
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let paths = doc["paths"].as_object().expect("paths");
    let mut ops = Vec::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("path item") {
            if METHODS.contains(&method.as_str()) {
                ops.push((method.to_uppercase(), path.clone(), op));
            }
        }
    }
    ops
}

/// The entries of a string enum schema (`oneOf` of `const`s) as `(value, description)`.
fn enum_entries(schema: &Value) -> Vec<(String, String)> {
    schema["oneOf"]
        .as_array()
        .expect("oneOf")
        .iter()
        .map(|e| {
            let value = e["const"].as_str().expect("const").to_owned();
            (value, e["description"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

fn collect_refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r),
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn document_is_openapi_3_1_with_info_and_tags() {
    let doc = document().await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["title"], "Hangar");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(!doc["info"]["description"].as_str().unwrap_or_default().is_empty());
    let tags: BTreeSet<&str> = doc["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| {
            assert!(!t["description"].as_str().unwrap_or_default().is_empty(), "{t}");
            t["name"].as_str().expect("tag name")
        })
        .collect();
    assert_eq!(
        tags,
        BTreeSet::from([
            "admin",
            "anthropic",
            "inference",
            "multi-model",
            "model-repository",
            "weight-control",
            "operations"
        ])
    );
    for (method, path, op) in operations(&doc) {
        let op_tags = op["tags"].as_array().expect("operation tags");
        assert!(!op_tags.is_empty(), "{method} {path}");
        for t in op_tags {
            assert!(
                tags.contains(t.as_str().unwrap_or_default()),
                "{method} {path}: unknown tag {t}"
            );
        }
    }
}

#[tokio::test]
async fn every_route_is_documented_with_a_description_and_a_unique_id() {
    let doc = document().await;
    let ops = operations(&doc);
    let documented: BTreeSet<(String, String)> =
        ops.iter().map(|(m, p, _)| (m.clone(), p.clone())).collect();
    let expected: BTreeSet<(String, String)> =
        ROUTES.iter().map(|(m, p)| ((*m).to_owned(), (*p).to_owned())).collect();
    assert_eq!(documented, expected);
    assert_eq!(ops.len(), ROUTES.len());

    let mut ids = BTreeSet::new();
    for (method, path, op) in &ops {
        let id = op["operationId"].as_str().expect("operationId");
        assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
        assert!(
            !op["summary"].as_str().unwrap_or_default().is_empty(),
            "{method} {path}: no summary"
        );
        assert!(
            op["description"].as_str().unwrap_or_default().len() > 10,
            "{method} {path}: no description"
        );
        let responses = op["responses"].as_object().expect("responses");
        assert!(responses.contains_key("200"), "{method} {path}");
        for (status, response) in responses {
            assert!(
                !response["description"].as_str().unwrap_or_default().is_empty(),
                "{method} {path} {status}"
            );
            // Every error status names its codes and has a JSON envelope.
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                assert!(schema.is_string(), "{method} {path} {status}: {response}");
            }
        }
        // A route that takes a body documents 413, 422 and 408 (a late body).
        if op.get("requestBody").is_some() {
            assert!(
                ["413", "422", "408"].iter().all(|s| responses.contains_key(*s)),
                "{method} {path}"
            );
        }
        // Every `{param}` of the path is a documented path parameter.
        for param in path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')) {
            let params = op["parameters"].as_array().expect("parameters");
            let p = params
                .iter()
                .find(|p| p["name"] == param)
                .unwrap_or_else(|| panic!("{method} {path}: {param}"));
            assert_eq!((p["in"].as_str(), p["required"].as_bool()), (Some("path"), Some(true)));
            assert!(!p["description"].as_str().unwrap_or_default().is_empty());
        }
    }
}

#[tokio::test]
async fn every_reference_resolves() {
    let doc = document().await;
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 10, "expected many references, got {refs:?}");
    for r in refs {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("non-local reference {r}"));
        assert!(pointer.starts_with("/components/"), "{r}");
        assert!(doc.pointer(pointer).is_some(), "dangling reference {r}");
    }
    for (name, schema) in doc["components"]["schemas"].as_object().expect("schemas") {
        assert!(schema.get("$schema").is_none(), "{name} keeps $schema");
    }
}

#[tokio::test]
async fn every_model_state_and_error_code_is_described() {
    let doc = document().await;
    let schemas = &doc["components"]["schemas"];
    let states = enum_entries(&schemas["ModelState"]);
    let names: Vec<&str> = states.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(names, ["unloaded", "loading", "loaded", "unloading", "failed"]);
    for (value, description) in &states {
        assert!(description.len() > 10, "state {value} has no description");
    }

    let codes = enum_entries(&schemas["ErrorCode"]);
    let values: BTreeSet<&str> = codes.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(values.len(), codes.len(), "duplicate codes");
    let expected = [
        // Control plane.
        "state_conflict",
        "model_type_mismatch",
        "unknown_model",
        "model_not_loaded",
        "model_loading",
        "model_unloading",
        "model_failed",
        "queue_full",
        "invalid_request_body",
        "invalid_load_request",
        "load_failed",
        "backend_crashed",
        "cancelled",
        "invalid_request",
        "unsupported",
        "runtime_error",
        // HTTP layer.
        "not_found",
        "method_not_allowed",
        "payload_too_large",
        "unauthorized",
        "forbidden",
        "thinking_unsupported",
        "nothing_to_unload",
        "model_not_ready",
    ];
    for code in expected {
        assert!(values.contains(code), "ErrorCode lacks {code}");
    }
    for (value, description) in &codes {
        assert!(description.len() > 5, "code {value} has no description");
    }

    // The envelope's `code` is an ErrorCode; v2 routes use the v2 envelope.
    let envelope = &schemas["ErrorBody"];
    let detail_ref = envelope["properties"]["error"]["$ref"].as_str().expect("error ref");
    let detail = doc.pointer(detail_ref.trim_start_matches('#')).expect("ErrorObject");
    assert_eq!(detail["properties"]["code"]["$ref"], "#/components/schemas/ErrorCode");
    assert_eq!(detail["properties"]["message"]["type"], "string");
    assert_eq!(schemas["V2ErrorBody"]["properties"]["error"]["type"], "string");
    let error_schema = |path: &str, method: &str, status: &str| {
        doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
            ["$ref"]
            .clone()
    };
    assert_eq!(error_schema("/v1/admin/models", "get", "400"), "#/components/schemas/ErrorBody");
    assert_eq!(
        error_schema("/v1/chat/completions", "post", "503"),
        "#/components/schemas/ErrorBody"
    );
    assert_eq!(
        error_schema("/v2/repository/models/{name}/load", "post", "400"),
        "#/components/schemas/V2ErrorBody"
    );
    // Each status lists its codes.
    let load = &doc["paths"]["/v1/admin/models/{name}/load"]["post"]["responses"];
    let bad = load["400"]["description"].as_str().unwrap();
    assert!(bad.contains("`invalid_load_request`") && bad.contains("`load_failed`"), "{bad}");
    assert!(load["409"]["description"].as_str().unwrap().contains("`state_conflict`"));
}

#[tokio::test]
async fn without_an_admin_key_no_route_declares_security() {
    let doc = document().await;
    assert!(doc["components"].get("securitySchemes").is_none());
    for (method, path, op) in operations(&doc) {
        assert!(op.get("security").is_none(), "{method} {path}");
        assert!(op["responses"].get("401").is_none(), "{method} {path}");
    }
}

#[tokio::test]
async fn admin_routes_require_the_bearer_scheme() {
    let doc = document_of(&service_with_key(Some("secret"))).await;
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer"))
    );
    let admin_paths = [
        ("GET", "/v1/admin/models"),
        ("GET", "/v1/admin/models/{name}"),
        ("GET", "/v1/admin/models/{name}/logs"),
        ("GET", "/v1/admin/events"),
        ("POST", "/v1/admin/models/{name}/load"),
        ("POST", "/v1/admin/models/{name}/unload"),
        ("GET", "/v1/admin/gpu-memory"),
        ("POST", "/v1/admin/config/reload"),
        ("POST", "/v1/admin/models/{name}/leases"),
        ("POST", "/v1/admin/models/{name}/leases/{id}"),
        ("DELETE", "/v1/admin/models/{name}/leases/{id}"),
        ("POST", "/v1/admin/models/{name}/pause"),
        ("POST", "/v1/admin/models/{name}/continue"),
        ("POST", "/v1/admin/models/{name}/sleep"),
        ("POST", "/v1/admin/models/{name}/wake"),
        ("POST", "/v1/admin/models/{name}/update-weights-from-disk"),
        ("POST", "/v1/admin/models/{name}/weights-checker"),
        ("GET", "/model_info"),
        ("POST", "/model_info"),
        ("POST", "/pause_generation"),
        ("POST", "/continue_generation"),
        ("POST", "/update_weights_from_disk"),
        ("GET", "/weights_checker"),
        ("POST", "/weights_checker"),
        ("POST", "/update_weights_from_tensor"),
        ("POST", "/init_weights_update_group"),
        ("POST", "/destroy_weights_update_group"),
        ("POST", "/update_weights_from_distributed"),
        ("POST", "/api/v1/load"),
        ("POST", "/api/v1/unload"),
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/{name}/load"),
        ("POST", "/v2/repository/models/{name}/unload"),
    ];
    for (method, path, op) in operations(&doc) {
        let is_admin_route = admin_paths.contains(&(method.as_str(), path.as_str()));
        let secured = op.get("security").is_some_and(|s| s == &json!([{ "bearerAuth": [] }]));
        if is_admin_route {
            assert!(secured, "{method} {path} lacks security");
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                responses.contains_key("401") && responses.contains_key("403"),
                "{method} {path}"
            );
        }
        if !is_admin_route {
            assert!(op.get("security").is_none(), "{method} {path} is not an admin route");
        }
    }
    // The admin load takes an optional body; the snapshot is its answer.
    let load = &doc["paths"]["/v1/admin/models/{name}/load"]["post"];
    assert_eq!(load["requestBody"]["required"], false);
    assert!(load["requestBody"]["content"]["application/json"]["schema"]["$ref"].is_string());
    assert_eq!(
        load["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ModelRow"
    );
    let metrics = &doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
    let types: Vec<&String> = metrics.as_object().unwrap().keys().collect();
    assert!(types.iter().any(|t| t.starts_with("text/plain")), "{metrics}");
}

#[tokio::test]
async fn streaming_routes_offer_an_event_stream() {
    let doc = document().await;
    let content = |path: &str| doc["paths"][path]["post"]["responses"]["200"]["content"].clone();
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/responses"] {
        let content = content(path);
        assert!(content.get("application/json").is_some(), "{path}: {content}");
        assert!(content.get("text/event-stream").is_some(), "{path}: {content}");
    }
    for path in ["/v1/embeddings", "/v1/rerank"] {
        assert!(content(path).get("text/event-stream").is_none(), "{path}");
    }
    // Each stream's schema is that of one parsed event: `data` a string holding JSON of the
    // event's schema, as validators check every event of a stream.
    let events = &doc["paths"]["/v1/admin/events"]["get"]["responses"]["200"]["content"];
    let chat = content("/v1/chat/completions");
    for stream in [&events["text/event-stream"], &chat["text/event-stream"]] {
        let schema = &stream["schema"];
        assert_eq!((&schema["type"], &schema["required"]), (&json!("object"), &json!(["data"])));
        let data = &schema["properties"]["data"];
        assert_eq!(
            (&data["type"], &data["contentMediaType"]),
            (&json!("string"), &json!("application/json"))
        );
        assert_eq!(data["contentSchema"], stream["x-event-schema"]);
        assert!(data["contentSchema"]["$ref"].is_string(), "{data}");
    }
}

/// A line of the Prometheus text format: `name{labels} value`, labels optional, the value a
/// float or `[+-]Inf`.
fn is_sample_line(line: &str) -> bool {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let mut chars = name.chars();
    let name_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return false;
    }
    let mut rest = &line[name_end..];
    if let Some(labels) = rest.strip_prefix('{') {
        let Some(close) = labels.find('}') else { return false };
        rest = &labels[close + 1..];
    }
    let Some(value) = rest.strip_prefix(' ') else { return false };
    // `-?[0-9.eE+-]+` or `[+-]?Inf`.
    let numeric = !value.is_empty()
        && value.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    numeric || matches!(value, "Inf" | "+Inf" | "-Inf")
}

#[test]
fn sample_line_checker_follows_the_format() {
    for good in [
        "a 1",
        "a_b:c{x=\"y\"} 0.5",
        "h_bucket{le=\"+Inf\"} 3",
        "g -1e-3",
        "g +Inf",
        "g -Inf",
        "_x 12",
    ] {
        assert!(is_sample_line(good), "{good}");
    }
    for bad in [
        "1a 1",
        "a{x=\"y\" 1",
        "a  1",
        "a 1 2",
        "a NaNa",
        "a",
        "a{} ",
        "a- 1",
        "a 1x",
        "a{x=\"}\"} 1",
    ] {
        assert!(!is_sample_line(bad), "{bad}");
    }
}

#[tokio::test]
async fn metrics_follow_the_prometheus_text_format() {
    let service = service();
    let (status, _, body) = call(&service, Method::POST, "/v1/admin/models/chat/load", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = call(&service, Method::GET, "/v1/admin/models", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let chat =
        r#"{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}"#;
    let (status, _, body) = call(&service, Method::POST, "/v1/chat/completions", chat).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, content_type, text) = call(&service, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&"hangar_model_state{model=\"chat\",state=\"loaded\"} 1"), "{text}");
    assert!(lines.contains(&"hangar_model_state{model=\"bge\",state=\"unloaded\"} 1"), "{text}");
    assert!(lines.contains(&"hangar_model_loads_total 1"), "{text}");
    let chat_inf_bucket = |l: &&str| {
        l.starts_with("hangar_request_duration_seconds_bucket{")
            && l.contains("model=\"chat\"")
            && l.contains("le=\"+Inf\"")
            && l.ends_with("} 1")
    };
    assert!(lines.iter().any(chat_inf_bucket), "{text}");
    for line in lines.iter().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        assert!(is_sample_line(line), "not a Prometheus sample line: {line:?}");
    }
    for help in lines.iter().filter(|l| l.starts_with("# HELP")) {
        assert!(!help.ends_with(".."), "{help}");
    }
}
