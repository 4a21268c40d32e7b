//! `hangard serve` as operators run it: the real binary on an OS-assigned loopback port,
//! driven over HTTP and by the `hangard ps | load | unload` client.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Server, Sse, code, get, hangard, load, post, send, unload};

// ---------------------------------------------------------------------------------------
// HTTP helpers

async fn state(server: &Server, model: &str) -> String {
    let (status, row) = get(server, &format!("/v1/admin/models/{model}")).await;
    assert_eq!(status, 200, "{row}");
    row["runtime_state"].as_str().unwrap().to_owned()
}

/// Every model's state from `GET /v1/admin/models`, in config order.
async fn states(server: &Server) -> Vec<(String, String)> {
    let (status, body) = get(server, "/v1/admin/models").await;
    assert_eq!(status, 200, "{body}");
    body["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().into(), m["runtime_state"].as_str().unwrap().into()))
        .collect()
}

/// Polls the model's row until it reaches `wanted` (a state change driven by another
/// request), failing after 10 s.
async fn wait_for_state(server: &Server, model: &str, wanted: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = state(server, model).await;
        if now == wanted {
            return;
        }
        assert!(Instant::now() < deadline, "{model} is still {now}, never {wanted}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn chat_body(model: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": "Tell me about hangars." }],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// A streaming chat completion read event by event (OpenAI's SSE format).
struct ChatStream(Sse);

impl ChatStream {
    async fn start(server: &Server, model: &str, max_tokens: u32) -> Self {
        Self(Sse::start(server, "/v1/chat/completions", &chat_body(model, max_tokens, true)).await)
    }

    /// The `data:` payload of the next event; `None` at the end of the body.
    async fn next(&mut self) -> Option<String> {
        self.0.next().await.map(|event| event.data)
    }

    /// Reads the first content event: the request is admitted and running.
    async fn running(&mut self) {
        let first = self.next().await.expect("a first event");
        assert_ne!(first, "[DONE]");
    }

    /// Reads to the end and checks the stream completed normally: chunks of
    /// `chat.completion.chunk`, a finish reason, then `[DONE]` as the last event.
    async fn completes(mut self) {
        let mut events = Vec::new();
        while let Some(data) = self.next().await {
            events.push(data);
        }
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        let chunks: Vec<Value> =
            events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"), "{chunks:?}");
        let finish = chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert!(matches!(finish, Some("length" | "stop")), "no finish reason in {chunks:?}");
    }
}

/// Stub models and one model of each engine that is not compiled into this build; their
/// load requests are validated all the same.
fn admin_config() -> Value {
    json!({
        "max_loaded_models": { "llm": 4 },
        "models": {
            "chat": { "backend": "stub", "replica_max": 2 },
            "slow-unload": { "backend": "stub", "stub": { "unload_delay_ms": 1500 } },
            "broken": { "backend": "stub", "stub": { "fail_load": "simulated: CUDA out of memory" } },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/tiny.gguf", "gguf_n_ctx": 2048 },
            "exl": {
                "backend": "exllamav3",
                "model_path": "/models/qwen3-exl3",
                "exllama_cache_size": 32768
            },
            "ls": { "backend": "llama_server", "model_path": "/models/qwen3.gguf" },
            "vl": { "backend": "vllm", "model_path": "Qwen/Qwen3-0.6B" }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Admin API: every status of the spec's examples

#[tokio::test]
async fn unknown_models_answer_404_on_show_load_and_unload() {
    let server = Server::start(&admin_config(), &[]);
    for (status, body) in [
        get(&server, "/v1/admin/models/nope").await,
        load(&server, "nope", json!({})).await,
        unload(&server, "nope").await,
    ] {
        assert_eq!((status, code(&body)), (404, "unknown_model"), "{body}");
    }
}

#[tokio::test]
async fn load_and_unload_answer_200_and_repeating_them_changes_nothing() {
    let server = Server::start(&admin_config(), &[]);
    let (status, row) = load(&server, "chat", json!({ "replicas": 2 })).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(
        (row["runtime_state"].as_str(), row["loaded_replicas"].as_u64()),
        (Some("loaded"), Some(2))
    );

    let (status, again) = load(&server, "chat", json!({})).await;
    assert_eq!((status, again["runtime_state"].as_str()), (200, Some("loaded")), "{again}");
    assert_eq!(again["loaded_replicas"], 2, "an idempotent load keeps the running replicas");

    let (status, row) = unload(&server, "chat").await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
    assert_eq!(row["loaded_replicas"], 0);
    let (status, row) = unload(&server, "chat").await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
}

#[tokio::test]
async fn bodies_that_fail_the_schema_answer_422() {
    let server = Server::start(&admin_config(), &[]);
    let cases = [
        ("gguf", json!({ "gguf_n_ctx": 0 }), Some("gguf_n_ctx")),
        ("exl", json!({ "exllama_cache_size": 0 }), Some("exllama_cache_size")),
        ("exl", json!({ "exllama_max_rq_tokens": 0 }), Some("exllama_max_rq_tokens")),
        ("chat", json!({ "replicas": 0 }), Some("replicas")),
        ("chat", json!([1, 2]), None),
    ];
    for (model, body, field) in cases {
        let (status, answer) = load(&server, model, body.clone()).await;
        assert_eq!(
            (status, code(&answer)),
            (422, "invalid_request_body"),
            "{model} {body}: {answer}"
        );
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{model} {body}: {answer}");
        }
        assert_eq!(state(&server, model).await, "unloaded", "{model} {body}: nothing changes");
    }
    let response = reqwest::Client::new()
        .post(server.url("/v1/admin/models/chat/load"))
        .header("content-type", "application/json")
        .body("{\"replicas\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422, "malformed JSON");
}

#[tokio::test]
async fn values_wrong_for_the_backend_answer_400_invalid_load_request() {
    let server = Server::start(&admin_config(), &[]);
    let cases = [
        ("gguf", json!({ "gguf_type_k": "q8-0" })),
        ("gguf", json!({ "gguf_type_k": "foo" })),
        ("gguf", json!({ "exllama_cache_size": 32768 })),
        ("exl", json!({ "exllama_cache_k_bits": 8 })),
        (
            "exl",
            json!({ "exllama_cache_quant": "8,8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8 }),
        ),
        ("exl", json!({ "exllama_cache_size": 8000 })),
        ("exl", json!({ "exllama_cache_quant": "fp16" })),
        ("ls", json!({ "llama_server_spec_type": "medusa" })),
        ("ls", json!({ "llama_server_spec_draft_n_max": 7 })),
        ("ls", json!({ "llama_server_spec_draft_p_min": 1.5 })),
        ("vl", json!({ "llama_server_n_ctx": 4096 })),
        ("chat", json!({ "replicas": 3 })),
    ];
    for (model, body) in cases {
        let (status, answer) = load(&server, model, body.clone()).await;
        assert_eq!(
            (status, code(&answer)),
            (400, "invalid_load_request"),
            "{model} {body}: {answer}"
        );
        let (_, row) = get(&server, &format!("/v1/admin/models/{model}")).await;
        assert_eq!(row["runtime_state"], "unloaded", "{model} {body}: nothing changes");
        assert_eq!(row["load_override"], json!({}), "{model} {body}: nothing changes");
    }
}

#[tokio::test]
async fn options_sent_to_a_loaded_model_answer_400_and_leave_it_loaded() {
    let server = Server::start(&admin_config(), &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let (status, answer) = load(&server, "chat", json!({ "replicas": 2 })).await;
    assert_eq!((status, code(&answer)), (400, "invalid_load_request"), "{answer}");
    let (_, row) = get(&server, "/v1/admin/models/chat").await;
    assert_eq!(
        (row["runtime_state"].as_str(), row["loaded_replicas"].as_u64()),
        (Some("loaded"), Some(1))
    );
}

#[tokio::test]
async fn load_while_unloading_answers_409() {
    let server = Server::start(&admin_config(), &[]);
    assert_eq!(load(&server, "slow-unload", json!({})).await.0, 200);
    let unloading = tokio::spawn({
        let url = server.url("/v1/admin/models/slow-unload/unload");
        async move { send(Method::POST, &url, None, None).await }
    });
    wait_for_state(&server, "slow-unload", "unloading").await;

    let (status, answer) = load(&server, "slow-unload", json!({})).await;
    assert_eq!((status, code(&answer)), (409, "state_conflict"), "{answer}");
    assert_eq!(answer["error"]["runtime_state"], "unloading", "{answer}");
    let (status, row) = unload(&server, "slow-unload").await;
    assert_eq!(
        (status, row["runtime_state"].as_str()),
        (200, Some("unloading")),
        "already unloading: {row}"
    );

    let (status, row) = unloading.await.unwrap();
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
}

#[tokio::test]
async fn a_failing_load_answers_400_load_failed_and_keeps_last_error() {
    let server = Server::start(&admin_config(), &[]);
    let (status, answer) = load(&server, "broken", json!({})).await;
    assert_eq!((status, code(&answer)), (400, "load_failed"), "{answer}");
    let model = &answer["error"]["model"];
    assert_eq!(model["runtime_state"], "failed", "{answer}");
    assert!(
        model["last_error"].as_str().unwrap().contains("simulated: CUDA out of memory"),
        "{answer}"
    );

    let (_, row) = get(&server, "/v1/admin/models/broken").await;
    assert_eq!(row["runtime_state"], "failed");
    assert!(row["last_error"].as_str().unwrap().contains("CUDA out of memory"), "{row}");
}

#[tokio::test]
async fn an_engine_that_cannot_start_fails_to_load_and_evicts_nothing() {
    let mut config = admin_config();
    config["max_loaded_models"] = json!({ "llm": 1 });
    // The vLLM bridge's interpreter does not exist: the preflight fails before eviction.
    config["models"]["vl"]["bridge_python"] = json!("/nonexistent/python3");
    let server = Server::start(&config, &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let (status, answer) = load(&server, "vl", json!({})).await;
    assert_eq!((status, code(&answer)), (400, "load_failed"), "{answer}");
    let last_error = answer["error"]["model"]["last_error"].as_str().unwrap();
    assert!(
        last_error.contains("/nonexistent/python3") && last_error.contains("bridge_python"),
        "{last_error}"
    );
    assert_eq!(
        state(&server, "chat").await,
        "loaded",
        "an engine that cannot start evicts nothing"
    );
}

#[cfg(feature = "llama-cpp")]
#[tokio::test]
async fn a_llama_cpp_model_without_its_file_fails_as_not_found_and_evicts_nothing() {
    let server = Server::start(&admin_config(), &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let (status, answer) = load(&server, "gguf", json!({ "gguf_n_ctx": 4096 })).await;
    assert_ne!(status, 200, "{answer}");
    let last_error = answer["error"]["model"]["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("/models/tiny.gguf"), "{answer}");
    assert_eq!(state(&server, "chat").await, "loaded", "a missing file evicts nothing");
}

// ---------------------------------------------------------------------------------------
// Start-up, slots, auto-load, unload-all, limits, auth

#[tokio::test]
async fn enabled_models_load_at_start_and_a_failing_one_is_not_fatal() {
    let config = json!({
        "models": {
            "broken": { "backend": "stub", "enabled": true, "stub": { "fail_load": "simulated" } },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/tiny.gguf", "enabled": true },
            "chat": { "backend": "stub", "enabled": true, "stub": { "load_delay_ms": 50 } },
            "idle": { "backend": "stub" }
        }
    });
    let server = Server::start(&config, &[]);
    wait_for_state(&server, "chat", "loaded").await;
    assert_eq!(
        states(&server).await,
        [("broken", "failed"), ("gguf", "failed"), ("chat", "loaded"), ("idle", "unloaded")]
            .map(|(n, s)| (n.to_owned(), s.to_owned()))
    );
    let (status, ready) = get(&server, "/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["not_loaded"], json!(["broken", "gguf"]), "{ready}");
    assert_eq!(get(&server, "/healthz").await.0, 200);
}

#[tokio::test]
async fn the_cli_slot_limit_wins_over_config_and_evicts_the_least_recently_used() {
    let config = json!({
        "max_loaded_models": { "llm": 3, "embedding": 2 },
        "models": {
            "a": { "backend": "stub" },
            "b": { "backend": "stub" },
            "e1": { "backend": "stub", "labels": ["embedding"] },
            "e2": { "backend": "stub", "labels": ["embedding"] }
        }
    });
    // One count: llm 1, and the missing embedding and reranking limits padded with 1.
    let server = Server::start(&config, &["--max-loaded-models", "1"]);
    for model in ["e1", "a", "b"] {
        assert_eq!(load(&server, model, json!({})).await.0, 200, "{model}");
    }
    let loaded = |states: Vec<(String, String)>| -> Vec<String> {
        states.into_iter().filter(|(_, s)| s == "loaded").map(|(n, _)| n).collect()
    };
    assert_eq!(loaded(states(&server).await), ["b", "e1"], "a was evicted, e1 holds another slot");
    assert_eq!(load(&server, "e2", json!({})).await.0, 200);
    assert_eq!(loaded(states(&server).await), ["b", "e2"], "the padded embedding limit is 1");
}

#[tokio::test]
async fn the_auto_load_flag_loads_a_model_on_its_first_request() {
    let config = json!({ "auto_load": false, "models": { "chat": { "backend": "stub" } } });
    let server = Server::start(&config, &["--auto-load"]);
    assert_eq!(state(&server, "chat").await, "unloaded");
    let (status, answer) = post(&server, "/v1/chat/completions", chat_body("chat", 4, false)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()),
        "{answer}"
    );
    assert_eq!(state(&server, "chat").await, "loaded");

    let config = json!({ "auto_load": true, "models": { "chat": { "backend": "stub" } } });
    let server = Server::start(&config, &["--auto-load=false"]);
    let (status, answer) = post(&server, "/v1/chat/completions", chat_body("chat", 4, false)).await;
    assert_eq!((status, code(&answer)), (503, "model_not_loaded"), "{answer}");
    assert_eq!(state(&server, "chat").await, "unloaded");
}

#[tokio::test]
async fn unload_without_a_model_name_unloads_every_model() {
    let config = json!({
        "models": {
            "a": { "backend": "stub" },
            "e": { "backend": "stub", "labels": ["embedding"] },
            "r": { "backend": "stub", "labels": ["reranking"] }
        }
    });
    let server = Server::start(&config, &[]);
    for model in ["a", "e", "r"] {
        assert_eq!(load(&server, model, json!({})).await.0, 200, "{model}");
    }
    let (status, answer) = post(&server, "/api/v1/unload", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    for (name, state) in states(&server).await {
        assert_eq!(state, "unloaded", "{name}");
    }
}

#[tokio::test]
async fn bodies_above_the_configured_limit_answer_413() {
    let config =
        json!({ "max_request_body_bytes": 256, "models": { "chat": { "backend": "stub" } } });
    let server = Server::start(&config, &[]);
    let big = json!({ "padding": "x".repeat(1000) });
    for path in ["/v1/admin/models/chat/load", "/v1/chat/completions"] {
        let (status, answer) = post(&server, path, big.clone()).await;
        assert_eq!((status, code(&answer)), (413, "payload_too_large"), "{path}: {answer}");
    }
    assert_eq!(state(&server, "chat").await, "unloaded");
    assert_eq!(load(&server, "chat", json!({})).await.0, 200, "a small body still passes");
}

#[tokio::test]
async fn admin_routes_need_the_bearer_key_from_the_flag_or_the_environment() {
    let config =
        json!({ "admin_api_key": "from-config", "models": { "chat": { "backend": "stub" } } });
    let server = Server::start(&config, &["--admin-api-key", "from-flag"]);
    let models = server.url("/v1/admin/models");
    let (status, answer) = send(Method::GET, &models, None, None).await;
    assert_eq!((status, code(&answer)), (401, "unauthorized"), "{answer}");
    let (status, answer) = send(Method::GET, &models, None, Some("from-config")).await;
    assert_eq!((status, code(&answer)), (403, "forbidden"), "the flag wins over config: {answer}");
    assert_eq!(send(Method::GET, &models, None, Some("from-flag")).await.0, 200);
    let (status, answer) =
        send(Method::POST, &server.url("/api/v1/unload"), Some(&json!({})), None).await;
    assert_eq!(
        (status, code(&answer)),
        (401, "unauthorized"),
        "unload-all is an admin route: {answer}"
    );
    assert_eq!(get(&server, "/healthz").await.0, 200, "operations routes stay open");

    let config = json!({ "models": { "chat": { "backend": "stub" } } });
    let server = Server::start_with(&config, &[], &[("HANGAR_ADMIN_KEY", "from-env")]);
    let models = server.url("/v1/admin/models");
    assert_eq!(send(Method::GET, &models, None, None).await.0, 401);
    assert_eq!(send(Method::GET, &models, None, Some("nope")).await.0, 403);
    assert_eq!(send(Method::GET, &models, None, Some("from-env")).await.0, 200);
}

// ---------------------------------------------------------------------------------------
// Graceful unload and shutdown with a stream running

fn streaming_config() -> Value {
    json!({ "models": { "chat": { "backend": "stub", "stub": { "token_latency_ms": 100 } } } })
}

#[tokio::test]
async fn unload_lets_a_running_stream_finish_and_refuses_new_requests_with_503() {
    let server = Server::start(&streaming_config(), &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let mut stream = ChatStream::start(&server, "chat", 20).await;
    stream.running().await;

    let unloading = tokio::spawn({
        let url = server.url("/v1/admin/models/chat/unload");
        async move { send(Method::POST, &url, None, None).await }
    });
    wait_for_state(&server, "chat", "unloading").await;
    let (status, answer) = post(&server, "/v1/chat/completions", chat_body("chat", 1, false)).await;
    assert_eq!((status, code(&answer)), (503, "model_unloading"), "{answer}");
    let (_, row) = get(&server, "/v1/admin/models/chat").await;
    assert_eq!(row["runtime_inflight"], 1, "the stream still runs: {row}");

    stream.completes().await;
    let (status, row) = unloading.await.unwrap();
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
    let (status, answer) = post(&server, "/v1/chat/completions", chat_body("chat", 1, false)).await;
    assert_eq!((status, code(&answer)), (503, "model_not_loaded"), "{answer}");
}

#[tokio::test]
async fn sigterm_lets_a_running_stream_finish_and_exits_0() {
    let mut server = Server::start(&streaming_config(), &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let mut stream = ChatStream::start(&server, "chat", 15).await;
    stream.running().await;

    server.terminate();
    stream.completes().await;
    let status = server.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", server.logs());
    assert!(server.logs().contains("SIGTERM"), "{}", server.logs());
}

// ---------------------------------------------------------------------------------------
// The client subcommands

#[test]
fn ps_load_and_unload_drive_a_running_server() {
    let config = json!({
        "models": {
            "chat:v1 beta": { "backend": "stub", "replica_max": 2 },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/tiny.gguf" }
        }
    });
    let server = Server::start(&config, &["--admin-api-key", "k"]);
    let cli = |args: &[&str]| {
        let out = hangard()
            .args(args)
            .env("HANGAR_URL", &server.base)
            .env("HANGAR_ADMIN_KEY", "k")
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };

    let (code, out, err) = cli(&["ps"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let header =
        ["NAME", "TYPE", "BACKEND", "STATE", "REPLICAS", "INFLIGHT", "QUEUE", "LAST ERROR"];
    assert_eq!(
        lines[0].split("  ").filter(|c| !c.is_empty()).map(str::trim).collect::<Vec<_>>(),
        header
    );
    let row: Vec<&str> = lines[1].split("  ").filter(|c| !c.is_empty()).map(str::trim).collect();
    assert_eq!(row, ["chat:v1 beta", "llm", "stub", "unloaded", "0/1", "0", "0", "-"], "{out}");

    let (code, out, err) = cli(&["load", "chat:v1 beta", "--replicas", "2"]);
    assert_eq!((code, out.trim()), (Some(0), "chat:v1 beta: loaded (2/2 replicas)"), "{err}");
    let (code, out, _) = cli(&["ps", "--json"]);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["models"][0]["runtime_state"], "loaded");
    assert_eq!(listed["models"][0]["loaded_replicas"], 2);

    let (code, out, err) = cli(&["unload", "chat:v1 beta"]);
    assert_eq!((code, out.trim()), (Some(0), "chat:v1 beta: unloaded (0/1 replicas)"), "{err}");

    let failures = [
        (&["load", "nope"][..], "unknown_model"),
        (&["load", "gguf", "--set", "gguf_n_ctx=0"][..], "invalid_request_body"),
        (&["load", "gguf", "--set", "gguf_type_k=q8-0"][..], "invalid_load_request"),
        (
            &["load", "gguf", "--set", "gguf_type_k=q8_0", "--set", "gguf_type_v=null"][..],
            "load_failed",
        ),
        (&["unload", "nope"][..], "unknown_model"),
    ];
    for (args, wanted) in failures {
        let (code, out, err) = cli(args);
        assert_eq!(code, Some(1), "{args:?}: {out}{err}");
        assert!(out.is_empty(), "{args:?}: nothing on stdout: {out}");
        assert!(err.starts_with(&format!("error: {wanted} (")), "{args:?}: {err}");
    }

    let out = hangard().args(["ps", "--url", &server.base]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unauthorized"), "no key sent");
    drop(server);
    let out = hangard().args(["ps", "--url", "http://127.0.0.1:1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"), "nothing listens");
}

#[tokio::test]
async fn the_grpc_listener_serves_beside_http_and_drains_with_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let settings = json!({ "models": { "chat": { "backend": "stub" } } });
    let mut server = Server::start(&settings, &["--grpc-port", &port.to_string()]);
    // Bound before the HTTP line is out: a gRPC client connects at once.
    use hangar_server::grpc::proto::{
        self, grpc_inference_service_client::GrpcInferenceServiceClient,
    };
    let mut client =
        GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{port}")).await.unwrap();
    let live = client.server_live(proto::ServerLiveRequest {}).await.unwrap().into_inner();
    assert!(live.live);
    let index = client.repository_index(proto::RepositoryIndexRequest::default()).await.unwrap();
    assert_eq!(index.into_inner().models[0].state, "UNAVAILABLE");
    // The client keeps its connection open: SIGTERM still ends the server promptly.
    assert!(server.logs().contains("gRPC (KServe v2 / Triton) listening"), "{}", server.logs());
    server.terminate();
    let status = server.wait(Duration::from_secs(10));
    assert!(status.success(), "{status}\n{}", server.logs());
}
