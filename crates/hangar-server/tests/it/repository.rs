//! The KServe v2 / Triton model repository (`/v2/…`) and the Lemonade-style multi-model
//! routes (`/api/v1/…`), driven in-process through `HangarService::handle` over a manager
//! on the stub backend (standing in for llama_cpp and llama_server too).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::stub::StubBackend;
use hangar_config::{BackendKind, Config, Secret};
use hangar_runtime::{Backends, LoadOptions, Manager};
use hangar_server::{HangarService, ServerOptions};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Helpers

/// A config with one model of each kind the tests need.
fn models() -> Value {
    json!({
        "max_loaded_models": { "llm": 8 },
        "models": {
            "chat": { "backend": "stub", "enabled": true },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/qwen3-8b.gguf", "replica_max": 2 },
            "server": {
                "backend": "llama_server",
                "model_path": "/models/gemma.gguf",
                "llama_server_extra_args": ["--jinja"],
                "llama_server_backends": { "vulkan": "/opt/llama-vulkan/llama-server" }
            },
            "exl": { "backend": "exllamav3", "model_path": "/models/exl3" },
            "slow": { "backend": "stub", "stub": { "load_delay_ms": 1000, "unload_delay_ms": 1000 } },
            "broken": { "backend": "stub", "stub": { "fail_load": "boom" } },
        }
    })
}

fn service_with(config: Value, options: impl FnOnce(&Config) -> ServerOptions) -> HangarService {
    let config = Config::from_value(&config).unwrap_or_else(|e| panic!("bad test config: {e}"));
    let backends = Backends::new()
        .with(Arc::new(StubBackend::new()))
        .with(Arc::new(StubBackend::with_kind(BackendKind::LlamaCpp)))
        .with(Arc::new(StubBackend::with_kind(BackendKind::LlamaServer)));
    let options = options(&config);
    HangarService::new(Manager::new(&config, backends), options)
}

fn service() -> HangarService {
    service_with(models(), ServerOptions::from_config)
}

/// Sends one request; answers the status and the body as JSON (`Value::Null` when empty).
async fn call(s: &HangarService, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let resp = s.handle(req).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (status, value)
}

async fn get(s: &HangarService, path: &str) -> (StatusCode, Value) {
    call(s, Method::GET, path, "").await
}

async fn post(s: &HangarService, path: &str, body: &str) -> (StatusCode, Value) {
    call(s, Method::POST, path, body).await
}

/// Asserts the KServe v2 error envelope: exactly `{"error": "<non-empty string>"}`.
#[track_caller]
fn v2_error(body: &Value) -> &str {
    let obj = body.as_object().unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(obj.len(), 1, "only `error`: {body}");
    let message = obj["error"].as_str().unwrap_or_else(|| panic!("error is no string: {body}"));
    assert!(!message.is_empty());
    message
}

/// Asserts the standard envelope and answers its code.
#[track_caller]
fn api_code(body: &Value) -> &str {
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("no code: {body}"))
}

fn state(s: &HangarService, name: &str) -> String {
    s.manager().model(name).unwrap().runtime_state.to_string()
}

/// One row of the repository index by name.
fn row<'a>(index: &'a Value, name: &str) -> &'a Value {
    index
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("{name} not in {index}"))
}

/// Lets spawned tasks run until they block (paused clock: advances 1 ms).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

// ---------------------------------------------------------------------------------------
// KServe v2: metadata and health

#[tokio::test]
async fn v2_server_metadata_names_hangar_and_the_repository_extension() {
    let s = service();
    let (status, body) = get(&s, "/v2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({ "name": "hangar", "version": env!("CARGO_PKG_VERSION"), "extensions": ["model_repository"] })
    );
}

#[tokio::test]
async fn v2_live_answers_200() {
    let s = service();
    assert_eq!(get(&s, "/v2/health/live").await, (StatusCode::OK, Value::Null));
}

#[tokio::test]
async fn v2_ready_is_503_until_every_enabled_model_is_loaded() {
    let s = service();
    let (status, body) = get(&s, "/v2/health/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(v2_error(&body).contains("chat"), "{body}");
    // Disabled models do not count.
    assert_eq!(post(&s, "/v2/repository/models/chat/load", "").await.0, StatusCode::OK);
    assert_eq!(get(&s, "/v2/health/ready").await, (StatusCode::OK, Value::Null));
}

#[tokio::test]
async fn v2_model_ready_is_200_when_loaded_400_when_not_and_404_when_unknown() {
    let s = service();
    let (status, body) = get(&s, "/v2/models/chat/ready").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "Triton answers 400 for not ready");
    assert!(v2_error(&body).contains("unloaded"), "{body}");

    post(&s, "/v2/repository/models/chat/load", "{}").await;
    assert_eq!(get(&s, "/v2/models/chat/ready").await, (StatusCode::OK, Value::Null));

    let (status, body) = get(&s, "/v2/models/nope/ready").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    v2_error(&body);

    post(&s, "/v2/repository/models/broken/load", "").await;
    let (status, body) = get(&s, "/v2/models/broken/ready").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v2_error(&body).contains("boom"), "the failure says why: {body}");
}

// ---------------------------------------------------------------------------------------
// KServe v2: index

#[tokio::test(start_paused = true)]
async fn v2_index_maps_every_runtime_state() {
    let s = service();
    // `broken` first: a failed load evicts every other model and retries.
    let (status, body) = post(&s, "/v2/repository/models/broken/load", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    v2_error(&body);
    post(&s, "/v2/repository/models/chat/load", "").await;

    // `slow` loading.
    let loading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/load", "").await }
    });
    settle().await;
    assert_eq!(state(&s, "slow"), "loading");
    let (status, index) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(index.as_array().map(Vec::len), Some(6), "every configured model: {index}");
    assert_eq!(
        row(&index, "chat"),
        &json!({ "name": "chat", "version": "1", "state": "READY", "reason": "" })
    );
    assert_eq!(row(&index, "slow")["state"], "LOADING");
    assert_eq!(
        row(&index, "gguf"),
        &json!({ "name": "gguf", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded" })
    );
    let broken = row(&index, "broken");
    assert_eq!(broken["state"], "UNAVAILABLE");
    assert_eq!(
        broken["reason"].as_str(),
        s.manager().model("broken").unwrap().last_error.as_deref(),
        "a failed model's reason is its last_error"
    );
    assert!(broken["reason"].as_str().unwrap().contains("boom"));
    assert_eq!(loading.await.unwrap().0, StatusCode::OK);

    // `slow` unloading.
    let unloading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/unload", "").await }
    });
    settle().await;
    assert_eq!(state(&s, "slow"), "unloading");
    let (_, index) = post(&s, "/v2/repository/index", "{}").await;
    assert_eq!(row(&index, "slow")["state"], "UNLOADING");
    assert_eq!(unloading.await.unwrap(), (StatusCode::OK, json!({})));
    let (_, index) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(row(&index, "slow")["state"], "UNAVAILABLE");
    assert_eq!(row(&index, "slow")["reason"], "unloaded");
}

#[tokio::test]
async fn v2_index_takes_an_empty_body_and_filters_ready_models() {
    let s = service();
    post(&s, "/v2/repository/models/chat/load", "").await;
    post(&s, "/v2/repository/models/gguf/load", "").await;

    // tritonclient sends an empty body.
    let (status, all) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all.as_array().unwrap().len(), 6);
    let (_, not_only_ready) = post(&s, "/v2/repository/index", r#"{"ready": false}"#).await;
    assert_eq!(not_only_ready, all);

    let (status, ready) = post(&s, "/v2/repository/index", r#"{"ready": true}"#).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> =
        ready.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["chat", "gguf"]);
    assert!(ready.as_array().unwrap().iter().all(|r| r["state"] == "READY"));

    let (status, body) = post(&s, "/v2/repository/index", r#"{"ready": "yes"}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    v2_error(&body);
}

// ---------------------------------------------------------------------------------------
// KServe v2: load

#[tokio::test]
async fn v2_load_takes_tritonclient_bodies_and_is_a_no_op_when_loaded() {
    let s = service();
    // tritonclient's load_model() without config sends `{}`.
    assert_eq!(
        post(&s, "/v2/repository/models/chat/load", "{}").await,
        (StatusCode::OK, json!({}))
    );
    assert_eq!(state(&s, "chat"), "loaded");
    // An empty body too.
    assert_eq!(post(&s, "/v2/repository/models/gguf/load", "").await, (StatusCode::OK, json!({})));
    assert_eq!(state(&s, "gguf"), "loaded");

    // Loaded, no config: nothing happens.
    let loads = s.manager().counters().loads;
    assert_eq!(
        post(&s, "/v2/repository/models/chat/load", "{}").await,
        (StatusCode::OK, json!({}))
    );
    assert_eq!(
        post(&s, "/v2/repository/models/chat/load", r#"{"parameters": {}}"#).await,
        (StatusCode::OK, json!({}))
    );
    assert_eq!(s.manager().counters().loads, loads);
    assert_eq!(s.manager().counters().unloads, 0);
}

#[tokio::test]
async fn v2_load_with_config_string_reloads_with_the_override_patch() {
    let s = service();
    post(&s, "/v2/repository/models/gguf/load", "{}").await;
    assert!(s.manager().model("gguf").unwrap().load_override.is_empty());

    // tritonclient's load_model(config=...) sends the config as a JSON string.
    let config = json!({ "name": "gguf", "gguf_n_ctx": 4096, "replicas": 2 }).to_string();
    let body = json!({ "parameters": { "config": config } }).to_string();
    assert_eq!(
        post(&s, "/v2/repository/models/gguf/load", &body).await,
        (StatusCode::OK, json!({}))
    );

    let model = s.manager().model("gguf").unwrap();
    assert!(model.is_loaded);
    assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(4096)));
    assert_eq!((model.replicas, model.loaded_replicas), (2, 2));
    let counters = s.manager().counters();
    assert_eq!(
        (counters.loads, counters.unloads),
        (2, 0),
        "reloaded in place: new runtimes swapped in, the old ones released without an unload"
    );

    // An empty config still reloads, and drops the previous override.
    let body = json!({ "parameters": { "config": "{}" } }).to_string();
    assert_eq!(
        post(&s, "/v2/repository/models/gguf/load", &body).await,
        (StatusCode::OK, json!({}))
    );
    let model = s.manager().model("gguf").unwrap();
    assert!(model.is_loaded && model.load_override.is_empty());
    assert_eq!(model.replicas, 1);
    assert_eq!(s.manager().counters().loads, 3);
}

#[tokio::test]
async fn v2_load_with_config_object_loads_an_unloaded_model() {
    let s = service();
    let body = json!({ "parameters": { "config": { "gguf_n_ctx": 2048 } } }).to_string();
    assert_eq!(
        post(&s, "/v2/repository/models/gguf/load", &body).await,
        (StatusCode::OK, json!({}))
    );
    let model = s.manager().model("gguf").unwrap();
    assert!(model.is_loaded);
    assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(2048)));
    assert_eq!(s.manager().counters().unloads, 0);
}

#[tokio::test]
async fn v2_load_with_a_bad_config_leaves_the_loaded_model_alone() {
    let s = service();
    let body = json!({ "parameters": { "config": { "gguf_n_ctx": 1024 } } }).to_string();
    post(&s, "/v2/repository/models/gguf/load", &body).await;

    let cases = [
        (json!({ "gguf_n_ctx": 0 }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "not_a_field": 1 }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "vllm_max_model_len": 4096 }), StatusCode::BAD_REQUEST),
        (json!({ "replicas": 3 }), StatusCode::BAD_REQUEST),
        (json!({ "replicas": 0 }), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({ "name": "chat" }), StatusCode::BAD_REQUEST),
    ];
    for (config, expected) in cases {
        let body = json!({ "parameters": { "config": config.to_string() } }).to_string();
        let (status, answer) = post(&s, "/v2/repository/models/gguf/load", &body).await;
        assert_eq!(status, expected, "{config}: {answer}");
        v2_error(&answer);
        let model = s.manager().model("gguf").unwrap();
        assert!(model.is_loaded, "{config}");
        assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(1024)), "{config}");
    }
    assert_eq!(s.manager().counters().unloads, 0, "no bad config unloaded the model");
}

#[tokio::test]
async fn v2_load_refuses_file_parameters_and_unknown_parameters() {
    let s = service();
    let body = json!({ "parameters": {
        "config": json!({ "gguf_n_ctx": 1024 }).to_string(),
        "file:1/model.gguf": "AAAA",
    } })
    .to_string();
    let (status, answer) = post(&s, "/v2/repository/models/gguf/load", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v2_error(&answer).contains("file:1/model.gguf"), "{answer}");
    assert_eq!(state(&s, "gguf"), "unloaded", "nothing was loaded");

    let (status, answer) =
        post(&s, "/v2/repository/models/gguf/load", r#"{"parameters": {"priority": 1}}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v2_error(&answer).contains("priority"), "{answer}");

    let (status, answer) = post(&s, "/v2/repository/models/gguf/load", r#"{"params": {}}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    v2_error(&answer);
    assert_eq!(state(&s, "gguf"), "unloaded");
}

#[tokio::test]
async fn v2_load_errors_use_the_v2_envelope() {
    let s = service();
    let cases = [
        ("/v2/repository/models/nope/load", "{}", StatusCode::NOT_FOUND),
        ("/v2/repository/models/broken/load", "{}", StatusCode::BAD_REQUEST),
        (
            "/v2/repository/models/gguf/load",
            r#"{"parameters": {"config": "not json"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v2/repository/models/gguf/load",
            r#"{"parameters": {"config": "[1]"}}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v2/repository/models/gguf/load",
            r#"{"parameters": {"config": 7}}"#,
            StatusCode::BAD_REQUEST,
        ),
        ("/v2/repository/models/gguf/load", "{not json", StatusCode::UNPROCESSABLE_ENTITY),
        (
            "/v2/repository/models/chat/load",
            r#"{"parameters": {"config": {"gguf_n_ctx": 1}}}"#,
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = post(&s, path, body).await;
        assert_eq!(status, expected, "{path} {body}: {answer}");
        v2_error(&answer);
    }
    let (_, answer) = post(&s, "/v2/repository/models/broken/load", "").await;
    assert!(v2_error(&answer).contains("boom"), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn v2_load_of_an_unloading_model_is_a_conflict() {
    let s = service();
    post(&s, "/v2/repository/models/slow/load", "").await;
    let unloading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/unload", "").await }
    });
    settle().await;
    let (status, answer) = post(&s, "/v2/repository/models/slow/load", "{}").await;
    assert_eq!(status, StatusCode::CONFLICT);
    v2_error(&answer);
    assert_eq!(unloading.await.unwrap().0, StatusCode::OK);
}

#[tokio::test]
async fn v2_repository_routes_answer_auth_errors_in_the_v2_envelope() {
    let s = service_with(models(), |_| ServerOptions {
        admin_api_key: Some(Secret::new("sekrit")),
        ..ServerOptions::default()
    });
    let (status, answer) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    v2_error(&answer);
    // Health routes stay open.
    assert_eq!(get(&s, "/v2/health/live").await.0, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------
// KServe v2: unload

#[tokio::test]
async fn v2_unload_takes_tritonclient_bodies() {
    let s = service();
    post(&s, "/v2/repository/models/chat/load", "").await;
    post(&s, "/v2/repository/models/gguf/load", "").await;
    // tritonclient's unload_model() always sends unload_dependents.
    let body = r#"{"parameters": {"unload_dependents": false}}"#;
    assert_eq!(
        post(&s, "/v2/repository/models/chat/unload", body).await,
        (StatusCode::OK, json!({}))
    );
    assert_eq!(state(&s, "chat"), "unloaded");
    let body = r#"{"parameters": {"unload_dependents": true}}"#;
    assert_eq!(
        post(&s, "/v2/repository/models/gguf/unload", body).await,
        (StatusCode::OK, json!({}))
    );
    assert_eq!(state(&s, "gguf"), "unloaded");
    // Empty body; already unloaded: nothing to do.
    assert_eq!(
        post(&s, "/v2/repository/models/gguf/unload", "").await,
        (StatusCode::OK, json!({}))
    );

    let (status, answer) = post(&s, "/v2/repository/models/nope/unload", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    v2_error(&answer);
    let (status, answer) =
        post(&s, "/v2/repository/models/gguf/unload", r#"{"parameters": {"force": true}}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v2_error(&answer).contains("force"));
    let (status, answer) = post(
        &s,
        "/v2/repository/models/gguf/unload",
        r#"{"parameters": {"unload_dependents": "yes"}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    v2_error(&answer);
}

#[tokio::test(start_paused = true)]
async fn v2_unload_while_loading_is_a_conflict() {
    let s = service();
    let loading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/load", "").await }
    });
    settle().await;
    let (status, answer) = post(&s, "/v2/repository/models/slow/unload", "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    v2_error(&answer);
    assert_eq!(loading.await.unwrap().0, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------
// Multi-model: health and stats

#[tokio::test]
async fn health_with_nothing_loaded_has_null_and_an_empty_list() {
    let s = service();
    let (status, body) = get(&s, "/api/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({ "status": "ok", "model_loaded": null, "checkpoint_loaded": null, "all_models_loaded": [] })
    );
}

#[tokio::test(start_paused = true)]
async fn health_lists_every_loaded_model_and_the_most_recent_one() {
    let s = service();
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;

    let (status, body) = get(&s, "/api/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["model_loaded"], "chat", "the most recently loaded");
    assert_eq!(body["checkpoint_loaded"], Value::Null, "chat has no model_path");
    let all = body["all_models_loaded"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    let gguf = all.iter().find(|m| m["model_name"] == "gguf").unwrap();
    let snapshot = s.manager().model("gguf").unwrap();
    assert_eq!(
        gguf,
        &json!({
            "model_name": "gguf",
            "checkpoint": "/models/qwen3-8b.gguf",
            "last_use": snapshot.last_use_unix_ms.expect("a loaded model has a last use"),
            "type": "llm",
            "device": ["gpu"],
            "backend_url": null,
            "recipe": "llama_cpp",
            "backend": "llama_cpp",
        })
    );
    let chat = all.iter().find(|m| m["model_name"] == "chat").unwrap();
    assert_eq!(chat["checkpoint"], Value::Null);
    assert_eq!(chat["device"], json!(["cpu"]));
    assert_eq!(chat["backend"], "stub");

    // Loading `gguf` again is a no-op and does not make it the most recent.
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(get(&s, "/api/v1/health").await.1["model_loaded"], "chat");

    post(&s, "/api/v1/unload", r#"{"model_name": "chat"}"#).await;
    let (_, body) = get(&s, "/api/v1/health").await;
    assert_eq!(body["all_models_loaded"].as_array().unwrap().len(), 1);
    assert_eq!(body["model_loaded"], "gguf", "the most recent of the models still loaded");
    assert_eq!(body["checkpoint_loaded"], "/models/qwen3-8b.gguf");
}

#[tokio::test]
async fn stats_reports_what_the_runtime_tracks() {
    let s = service();
    let (status, body) = get(&s, "/api/v1/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["models_loaded"], 0);
    assert_eq!(body["last_loaded_model"], Value::Null);
    assert_eq!(body["counters"]["loads"], 0);

    // `broken` first: a failed load evicts every other model and retries.
    post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;
    let (_, body) = get(&s, "/api/v1/stats").await;
    assert_eq!(body["models_loaded"], 1);
    assert_eq!(body["last_loaded_model"], "chat");
    assert_eq!(
        body["counters"],
        json!({ "loads": 1, "load_failures": 1, "unloads": 0, "evictions": 0, "crashes": 0 })
    );
    assert_eq!(body["output_tokens"], Value::Null, "no generation yet");

    // After a generation: the most recent request's token statistics.
    for (stream, max_tokens) in [(false, 3), (true, 5)] {
        let chat = json!({
            "model": "chat",
            "messages": [{ "role": "user", "content": "one two three" }],
            "max_tokens": max_tokens,
            "stream": stream
        });
        let req = Request::builder()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .body(Full::new(Bytes::from(chat.to_string())))
            .expect("request");
        let resp = s.handle(req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        // Reading the whole body waits for the end of a stream too.
        resp.into_body().collect().await.expect("body");
        let (_, body) = get(&s, "/api/v1/stats").await;
        assert_eq!(body["model"], "chat");
        assert_eq!(body["endpoint"], "chat_completions");
        assert_eq!(body["input_tokens"], 3);
        assert_eq!(body["output_tokens"], max_tokens);
        assert!(body["time_to_first_token"].as_f64().is_some_and(|t| t >= 0.0), "{body}");
    }
}

// ---------------------------------------------------------------------------------------
// Multi-model: load

#[tokio::test]
async fn load_maps_ctx_size_to_the_backend_context_field() {
    let s = service();
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 8192}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "gguf");
    assert_eq!(body["runtime_state"], "loaded");
    assert_eq!(body["load_override"], json!({ "gguf_n_ctx": 8192 }));
    let model = s.manager().model("gguf").unwrap();
    assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(8192)));

    let (status, body) = post(
        &s,
        "/api/v1/load",
        r#"{"model_name": "server", "ctx_size": 4096, "llamacpp_args": ""}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["load_override"], json!({ "llama_server_n_ctx": 4096 }));
}

#[tokio::test]
async fn load_refuses_ctx_size_where_it_has_no_meaning() {
    let s = service();
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "chat", "ctx_size": 4096}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(api_code(&body), "invalid_load_request");
    assert_eq!(body["error"]["message"], "ctx_size is not supported for backend stub");
    assert_eq!(body["error"]["field"], "ctx_size");

    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 0}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api_code(&body), "invalid_request_body");

    // A value the mapped field's constraints refuse names ctx_size and the field.
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "exl", "ctx_size": 1000}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(api_code(&body), "invalid_load_request");
    assert_eq!(body["error"]["field"], "ctx_size");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("exllama_cache_size") && message.contains("256"), "{message}");

    for name in ["chat", "gguf", "exl"] {
        assert_eq!(state(&s, name), "unloaded");
    }
}

#[tokio::test]
async fn load_maps_llamacpp_args_and_backend_onto_llama_server_overrides() {
    let s = service();
    let refused = [
        (json!({ "model_name": "chat", "llamacpp_args": "--threads 4" }), "only to llama_server"),
        (
            json!({ "model_name": "gguf", "llamacpp_args": ["--threads", "4"] }),
            "only to llama_server",
        ),
        (json!({ "model_name": "server", "llamacpp_args": "--threads 4 --port 9000" }), "`--port`"),
        (json!({ "model_name": "server", "llamacpp_args": "--host=0.0.0.0" }), "`--host`"),
        (json!({ "model_name": "server", "llamacpp_args": ["-m", "/other.gguf"] }), "`-m`"),
        (json!({ "model_name": "server", "llamacpp_args": ["--model=/other.gguf"] }), "`--model`"),
        // Only flags that touch neither files, the network nor the engine's auth.
        (json!({ "model_name": "server", "llamacpp_args": "--log-file /tmp/x" }), "`--log-file`"),
        (json!({ "model_name": "server", "llamacpp_args": "-hf org/model" }), "`-hf`"),
        (json!({ "model_name": "server", "llamacpp_args": "--lora a.gguf" }), "`--lora`"),
        (json!({ "model_name": "server", "llamacpp_args": "--path /" }), "`--path`"),
        (
            json!({ "model_name": "server", "llamacpp_args": "--slot-save-path s" }),
            "`--slot-save-path`",
        ),
        (json!({ "model_name": "server", "llamacpp_args": "--api-key k" }), "`--api-key`"),
        (json!({ "model_name": "server", "llamacpp_args": "--threads /etc/passwd" }), "paths"),
        (json!({ "model_name": "gguf", "llamacpp_backend": "vulkan" }), "only to llama_server"),
        (json!({ "model_name": "server", "llamacpp_backend": "rocm" }), "vulkan"),
    ];
    for (body, expected) in refused {
        let (status, answer) = post(&s, "/api/v1/load", &body.to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(api_code(&answer), "invalid_load_request", "{body}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let (status, answer) =
        post(&s, "/api/v1/load", r#"{"model_name": "server", "llamacpp_args": 4}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api_code(&answer), "invalid_request_body");
    for name in ["chat", "gguf", "server"] {
        assert_eq!(state(&s, name), "unloaded", "{name}");
    }

    // Accepted: the arguments replace the configured extra args and the build picks the
    // binary, for this load only; the definition is unchanged.
    let body = json!({
        "model_name": "server",
        "ctx_size": 8192,
        "llamacpp_args": "--threads 4 --no-webui",
        "llamacpp_backend": "vulkan"
    });
    let (status, model) = post(&s, "/api/v1/load", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{model}");
    assert_eq!(model["runtime_state"], "loaded");
    assert_eq!(
        model["load_override"],
        json!({
            "llama_server_n_ctx": 8192,
            "llama_server_extra_args": ["--threads", "4", "--no-webui"],
            "llama_server_binary_path": "/opt/llama-vulkan/llama-server"
        })
    );
    assert_eq!(model["definition"]["llama_server_extra_args"], json!(["--jinja"]));
    // The same options again: a no-op; different ones for a loaded model: refused.
    assert_eq!(post(&s, "/api/v1/load", &body.to_string()).await.0, StatusCode::OK);
    let other = json!({ "model_name": "server", "llamacpp_args": "--threads 8" });
    assert_eq!(post(&s, "/api/v1/load", &other.to_string()).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn load_answers_404_422_and_400_in_the_standard_envelope() {
    let s = service();
    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "nope"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_code(&body), "unknown_model");

    for bad in ["", "{}", r#"{"model_name": "chat", "checkpoint": "x"}"#] {
        let (status, body) = post(&s, "/api/v1/load", bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(api_code(&body), "invalid_request_body", "{bad}");
    }

    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(api_code(&body), "load_failed");
    assert_eq!(body["error"]["model"]["runtime_state"], "failed");
}

#[tokio::test]
async fn load_of_a_loaded_model_with_the_same_options_is_a_no_op() {
    let s = service();
    let body = r#"{"model_name": "gguf", "ctx_size": 4096, "replicas": 2}"#;
    assert_eq!(post(&s, "/api/v1/load", body).await.0, StatusCode::OK);
    let (status, answer) = post(&s, "/api/v1/load", body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["replicas"], 2);
    let (status, _) = post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 4096}"#).await;
    assert_eq!(status, StatusCode::OK, "same override, configured replicas unchanged");
    assert_eq!(s.manager().counters().loads, 1);

    // Other options for a loaded model: unload it first.
    let (status, answer) =
        post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 8192}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(api_code(&answer), "invalid_load_request");
    let model = s.manager().model("gguf").unwrap();
    assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(4096)));
}

// ---------------------------------------------------------------------------------------
// Multi-model: unload

#[tokio::test]
async fn unload_by_name_unloads_that_model_only() {
    let s = service();
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({ "status": "ok", "unloaded": ["gguf"] }));
    assert_eq!(state(&s, "gguf"), "unloaded");
    assert_eq!(state(&s, "chat"), "loaded");
}

#[tokio::test]
async fn unload_by_name_is_404_when_the_model_is_not_loaded() {
    let s = service();
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_code(&body), "nothing_to_unload");
    assert_eq!(body["error"]["runtime_state"], "unloaded");

    post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "broken"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_code(&body), "nothing_to_unload");

    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "nope"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(api_code(&body), "unknown_model");

    let (status, body) = post(&s, "/api/v1/unload", r#"{"model": "gguf"}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(api_code(&body), "invalid_request_body");
}

#[tokio::test]
async fn unload_without_a_name_unloads_every_loaded_model() {
    let s = service();
    for name in ["chat", "gguf", "server"] {
        s.manager().load(name, LoadOptions::default()).await.unwrap();
    }
    let (status, body) = post(&s, "/api/v1/unload", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({ "status": "ok", "unloaded": ["chat", "gguf", "server"] }));
    assert!(s.manager().models().iter().all(|m| !m.is_loaded));

    // Nothing left: `{}` unloads nothing.
    assert_eq!(
        post(&s, "/api/v1/unload", "{}").await,
        (StatusCode::OK, json!({ "status": "ok", "unloaded": [] }))
    );
    assert_eq!(s.manager().counters().unloads, 3);
}
