//! KServe v2: repository loads, with and without a config, and their errors.

use super::*;

#[tokio::test]
async fn v2_load_takes_tritonclient_bodies_and_is_a_no_op_when_loaded() {
    let s = service();
    // tritonclient's load_model() without config sends `{}`.
    assert_eq!(post(&s, "/v2/repository/models/chat/load", "{}").await, (200, json!({})));
    assert_eq!(state(&s, "chat"), "loaded");
    // An empty body too.
    assert_eq!(post(&s, "/v2/repository/models/gguf/load", "").await, (200, json!({})));
    assert_eq!(state(&s, "gguf"), "loaded");

    // Loaded, no config: nothing happens.
    let loads = s.manager().counters().loads;
    assert_eq!(post(&s, "/v2/repository/models/chat/load", "{}").await, (200, json!({})));
    assert_eq!(
        post(&s, "/v2/repository/models/chat/load", r#"{"parameters": {}}"#).await,
        (200, json!({}))
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
    assert_eq!(post(&s, "/v2/repository/models/gguf/load", &body).await, (200, json!({})));

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
    assert_eq!(post(&s, "/v2/repository/models/gguf/load", &body).await, (200, json!({})));
    let model = s.manager().model("gguf").unwrap();
    assert!(model.is_loaded && model.load_override.is_empty());
    assert_eq!(model.replicas, 1);
    assert_eq!(s.manager().counters().loads, 3);
}

#[tokio::test]
async fn v2_load_with_config_object_loads_an_unloaded_model() {
    let s = service();
    let body = json!({ "parameters": { "config": { "gguf_n_ctx": 2048 } } }).to_string();
    assert_eq!(post(&s, "/v2/repository/models/gguf/load", &body).await, (200, json!({})));
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
        (json!({ "gguf_n_ctx": 0 }), 422),
        (json!({ "not_a_field": 1 }), 422),
        (json!({ "vllm_max_model_len": 4096 }), 400),
        (json!({ "replicas": 3 }), 400),
        (json!({ "replicas": 0 }), 422),
        (json!({ "name": "chat" }), 400),
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
    assert_eq!(status, 400);
    assert!(v2_error(&answer).contains("file:1/model.gguf"), "{answer}");
    assert_eq!(state(&s, "gguf"), "unloaded", "nothing was loaded");

    let (status, answer) =
        post(&s, "/v2/repository/models/gguf/load", r#"{"parameters": {"priority": 1}}"#).await;
    assert_eq!(status, 400);
    assert!(v2_error(&answer).contains("priority"), "{answer}");

    let (status, answer) = post(&s, "/v2/repository/models/gguf/load", r#"{"params": {}}"#).await;
    assert_eq!(status, 422);
    v2_error(&answer);
    assert_eq!(state(&s, "gguf"), "unloaded");
}

#[tokio::test]
async fn v2_load_errors_use_the_v2_envelope() {
    let s = service();
    let cases = [
        ("/v2/repository/models/nope/load", "{}", 404),
        ("/v2/repository/models/broken/load", "{}", 400),
        ("/v2/repository/models/gguf/load", r#"{"parameters": {"config": "not json"}}"#, 400),
        ("/v2/repository/models/gguf/load", r#"{"parameters": {"config": "[1]"}}"#, 400),
        ("/v2/repository/models/gguf/load", r#"{"parameters": {"config": 7}}"#, 400),
        ("/v2/repository/models/gguf/load", "{not json", 422),
        (
            "/v2/repository/models/chat/load",
            r#"{"parameters": {"config": {"gguf_n_ctx": 1}}}"#,
            400,
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
    assert_eq!(status, 409);
    v2_error(&answer);
    assert_eq!(unloading.await.unwrap().0, 200);
}

#[tokio::test]
async fn v2_repository_routes_answer_auth_errors_in_the_v2_envelope() {
    let s = service_with().admin_key("sekrit").build();
    let (status, answer) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, 401);
    v2_error(&answer);
    // Health routes stay open.
    assert_eq!(get(&s, "/v2/health/live").await.0, 200);
}
