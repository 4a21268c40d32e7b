//! The multi-model routes: loads and how their options map onto each backend.

use super::*;

#[tokio::test]
async fn load_maps_ctx_size_to_the_backend_context_field() {
    let s = service();
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 8192}"#).await;
    assert_eq!(status, 200, "{body}");
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
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["load_override"], json!({ "llama_server_n_ctx": 4096 }));
}

#[tokio::test]
async fn load_refuses_ctx_size_where_it_has_no_meaning() {
    let s = service();
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "chat", "ctx_size": 4096}"#).await;
    assert_eq!(status, 400);
    assert_eq!(api_code(&body), "invalid_load_request");
    assert_eq!(body["error"]["message"], "ctx_size is not supported for backend stub");
    assert_eq!(body["error"]["field"], "ctx_size");

    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 0}"#).await;
    assert_eq!(status, 422);
    assert_eq!(api_code(&body), "invalid_request_body");

    // A value the mapped field's constraints refuse names ctx_size and the field.
    let (status, body) =
        post(&s, "/api/v1/load", r#"{"model_name": "exl", "ctx_size": 1000}"#).await;
    assert_eq!(status, 400, "{body}");
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
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(api_code(&answer), "invalid_load_request", "{body}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let (status, answer) =
        post(&s, "/api/v1/load", r#"{"model_name": "server", "llamacpp_args": 4}"#).await;
    assert_eq!(status, 422);
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
    assert_eq!(status, 200, "{model}");
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
    assert_eq!(post(&s, "/api/v1/load", &body.to_string()).await.0, 200);
    let other = json!({ "model_name": "server", "llamacpp_args": "--threads 8" });
    assert_eq!(post(&s, "/api/v1/load", &other.to_string()).await.0, 400);
}

#[tokio::test]
async fn load_answers_404_422_and_400_in_the_standard_envelope() {
    let s = service();
    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "nope"}"#).await;
    assert_eq!(status, 404);
    assert_eq!(api_code(&body), "unknown_model");

    for bad in ["", "{}", r#"{"model_name": "chat", "checkpoint": "x"}"#] {
        let (status, body) = post(&s, "/api/v1/load", bad).await;
        assert_eq!(status, 422, "{bad}");
        assert_eq!(api_code(&body), "invalid_request_body", "{bad}");
    }

    let (status, body) = post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    assert_eq!(status, 400);
    assert_eq!(api_code(&body), "load_failed");
    assert_eq!(body["error"]["model"]["runtime_state"], "failed");
}

#[tokio::test]
async fn load_of_a_loaded_model_with_the_same_options_is_a_no_op() {
    let s = service();
    let body = r#"{"model_name": "gguf", "ctx_size": 4096, "replicas": 2}"#;
    assert_eq!(post(&s, "/api/v1/load", body).await.0, 200);
    let (status, answer) = post(&s, "/api/v1/load", body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["replicas"], 2);
    let (status, _) = post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 4096}"#).await;
    assert_eq!(status, 200, "same override, configured replicas unchanged");
    assert_eq!(s.manager().counters().loads, 1);

    // Other options for a loaded model: unload it first.
    let (status, answer) =
        post(&s, "/api/v1/load", r#"{"model_name": "gguf", "ctx_size": 8192}"#).await;
    assert_eq!(status, 400);
    assert_eq!(api_code(&answer), "invalid_load_request");
    let model = s.manager().model("gguf").unwrap();
    assert_eq!(model.load_override.fields().get("gguf_n_ctx"), Some(&json!(4096)));
}
