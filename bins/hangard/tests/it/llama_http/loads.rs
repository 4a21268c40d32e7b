//! Load overrides and load / unload cycles.

use super::*;

// 6-7. Load overrides and load / unload cycles

#[tokio::test]
async fn gguf_load_overrides_apply_to_one_load_and_invalid_ones_change_nothing() {
    let models = json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 2048 })) });
    let server = serve(models, &[]).await;

    // Refused while unloaded, with the spec's statuses; nothing changes.
    let refused = [
        (json!({ "gguf_type_k": "q8-0" }), 400, "invalid_load_request", Some("gguf_type_k")),
        (json!({ "gguf_type_v": "foo" }), 400, "invalid_load_request", Some("gguf_type_v")),
        (
            json!({ "gguf_flash_attn": "maybe" }),
            400,
            "invalid_load_request",
            Some("gguf_flash_attn"),
        ),
        (
            json!({ "exllama_cache_size": 32768 }),
            400,
            "invalid_load_request",
            Some("exllama_cache_size"),
        ),
        (
            json!({ "llama_server_n_ctx": 4096 }),
            400,
            "invalid_load_request",
            Some("llama_server_n_ctx"),
        ),
        (json!({ "gguf_n_ctx": 0 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": -1 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": "512" }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": 512.5 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_flash_attn": true }), 422, "invalid_request_body", Some("gguf_flash_attn")),
        (json!({ "gguf_n_ctxx": 512 }), 422, "invalid_request_body", Some("gguf_n_ctxx")),
        // A config field that is no load override.
        (json!({ "gguf_n_batch": 64 }), 422, "invalid_request_body", Some("gguf_n_batch")),
        // One bad field spoils a good one.
        (
            json!({ "gguf_n_ctx": 512, "gguf_type_k": "q8-0" }),
            400,
            "invalid_load_request",
            Some("gguf_type_k"),
        ),
        (json!({ "replicas": 0 }), 422, "invalid_request_body", Some("replicas")),
        (json!({ "replicas": 2 }), 400, "invalid_load_request", None),
    ];
    for (body, status, error, field) in &refused {
        let (got, answer) = load(&server, "tiny", body.clone()).await;
        assert_eq!((got, code(&answer)), (*status, *error), "{body}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], *field, "{body}: {answer}");
        }
        let row = row(&server, "tiny").await;
        assert_eq!(row["runtime_state"], "unloaded", "{body}: nothing changes");
        assert_eq!(row["load_override"], json!({}), "{body}: nothing changes");
    }

    // A valid override: the row shows it, the definition stays as configured.
    let overrides = json!({
        "gguf_n_ctx": 512,
        "gguf_type_k": "q8_0",
        "gguf_type_v": "q8_0",
        "gguf_flash_attn": "on",
    });
    let (status, loaded) = load(&server, "tiny", overrides.clone()).await;
    assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{loaded}");
    assert_eq!(loaded["load_override"], overrides, "{loaded}");
    let shown = row(&server, "tiny").await;
    assert_eq!(shown["load_override"], overrides, "{shown}");
    assert_eq!(shown["definition"]["gguf_n_ctx"], 2048, "config is not modified: {shown}");
    assert_eq!(shown["definition"]["gguf_type_k"], Value::Null, "{shown}");

    // llama.cpp got them: a q8_0 cache serves, and the context holds 512 tokens.
    chat_ok(&server, "tiny", "hello", 4).await;
    let (status, answer) =
        post(&server, "/v1/chat/completions", chat_body("tiny", &long_prompt(300), 4)).await;
    assert_eq!((status, code(&answer)), (400, "invalid_request"), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("the context holds 512"), "{message}");

    // While loaded, any option is refused and the override in effect stays.
    for (body, status, error) in [
        (json!({ "gguf_n_ctx": 1024 }), 400, "invalid_load_request"),
        (json!({ "gguf_type_k": "q8-0" }), 400, "invalid_load_request"),
        (json!({ "gguf_n_ctx": "1024" }), 422, "invalid_request_body"),
        (json!({ "nope": 1 }), 422, "invalid_request_body"),
    ] {
        let (got, answer) = load(&server, "tiny", body.clone()).await;
        assert_eq!((got, code(&answer)), (status, error), "{body}: {answer}");
        let row = row(&server, "tiny").await;
        assert_eq!(row["runtime_state"], "loaded", "{body}: still loaded");
        assert_eq!(row["load_override"], overrides, "{body}: the override stays");
    }
    // An empty body is an idempotent load.
    let (status, same) = load(&server, "tiny", json!({})).await;
    assert_eq!((status, &same["load_override"]), (200, &overrides), "{same}");

    // Unloading ends the override; a plain load is the configured model again.
    let (status, unloaded) = unload(&server, "tiny").await;
    assert_eq!((status, unloaded["runtime_state"].as_str()), (200, Some("unloaded")));
    assert_eq!(unloaded["load_override"], json!({}), "{unloaded}");
    let (status, plain) = load(&server, "tiny", json!({})).await;
    assert_eq!((status, &plain["load_override"]), (200, &json!({})), "{plain}");
    let body = chat_ok(&server, "tiny", &long_prompt(300), 2).await;
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 512, "{body}");

    // Key presence matters: an explicit null is an override, and is shown.
    unload(&server, "tiny").await;
    let (status, nulled) = load(&server, "tiny", json!({ "gguf_type_k": null })).await;
    assert_eq!((status, &nulled["load_override"]), (200, &json!({ "gguf_type_k": null })));
    chat_ok(&server, "tiny", "hello", 2).await;
}

#[tokio::test]
async fn load_unload_cycles_serve_after_every_load() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &[]).await;
    for cycle in 0..3 {
        let (status, loaded) = load(&server, "tiny", json!({})).await;
        assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{cycle}");
        assert_eq!(loaded["loaded_replicas"], 1, "{loaded}");
        chat_ok(&server, "tiny", "hello", 3).await;

        let (status, unloaded) = unload(&server, "tiny").await;
        assert_eq!(
            (status, unloaded["runtime_state"].as_str(), unloaded["loaded_replicas"].as_u64()),
            (200, Some("unloaded"), Some(0)),
            "cycle {cycle}: {unloaded}"
        );
        let (status, refused) =
            post(&server, "/v1/chat/completions", chat_body("tiny", "hello", 3)).await;
        assert_eq!((status, code(&refused)), (503, "model_not_loaded"), "{refused}");
    }
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().unwrap();
    assert!(metrics.lines().any(|l| l == "hangar_model_loads_total 3"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "hangar_model_unloads_total 3"), "{metrics}");
}
