//! The admin API in-process: every status and error code the runtime admin spec lists,
//! as one table, plus the response shapes.

use std::sync::Arc;

use hangar_config::BackendKind;
use serde_json::{Value, json};

use hangar_server::HangarService;
use http::Method;

use crate::support::{call, get, metrics, post, request, server};

fn service(admin_key: Option<&str>) -> HangarService {
    server()
        .settings(json!({ "max_request_body_bytes": 4096 }))
        .models(json!({
        "gguf": { "backend": "llama_cpp", "model_path": "/m/g.gguf", "replica_max": 2, "gguf_n_ctx": 4096 },
        "exl": { "backend": "exllamav3", "model_path": "/m/e", "exllama_cache_quant": "8,8" },
        "ls": { "backend": "llama_server", "model_path": "/m/l.gguf" },
        "vl": { "backend": "vllm", "model_path": "Qwen/Qwen3-0.6B" },
        "stub": { "backend": "stub", "replica_max": 2, "stub": { "unload_delay_ms": 300 } },
        "broken": { "backend": "stub", "stub": { "fail_load": "simulated OOM" } }
    }))
        .stub_kinds([
            BackendKind::LlamaCpp,
            BackendKind::ExLlamaV3,
            BackendKind::LlamaServer,
            BackendKind::Vllm,
        ])
        .admin_key(admin_key)
        .build()
}

/// `(path, body, status, code)` — every example of the spec's load rules and validation list.
#[tokio::test]
async fn load_answers_every_spec_example_with_its_status_and_code() {
    let s = service(None);
    let cases: &[(&str, &str, u16, Option<&str>)] = &[
        ("/v1/admin/models/nope/load", "", 404, Some("unknown_model")),
        // 422: the body fails the schema before runtime logic runs.
        ("/v1/admin/models/gguf/load", r#"{"gguf_n_ctx": 0}"#, 422, Some("invalid_request_body")),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_size": 0}"#,
            422,
            Some("invalid_request_body"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_max_rq_tokens": 0}"#,
            422,
            Some("invalid_request_body"),
        ),
        (
            "/v1/admin/models/gguf/load",
            r#"{"gguf_n_ctx": "big"}"#,
            422,
            Some("invalid_request_body"),
        ),
        (
            "/v1/admin/models/gguf/load",
            r#"{"gguf_n_ctx": 8192,"#,
            422,
            Some("invalid_request_body"),
        ),
        (
            "/v1/admin/models/gguf/load",
            r#"{"no_such_field": 1}"#,
            422,
            Some("invalid_request_body"),
        ),
        ("/v1/admin/models/gguf/load", r#"{"replicas": 0}"#, 422, Some("invalid_request_body")),
        // 400 invalid_load_request: structurally valid, wrong for the backend.
        (
            "/v1/admin/models/gguf/load",
            r#"{"gguf_type_k": "q8-0"}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/gguf/load",
            r#"{"gguf_type_k": "foo"}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_k_bits": 8}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_quant": "8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_size": 8000}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_quant": "fp16"}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/ls/load",
            r#"{"llama_server_spec_type": "medusa"}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/ls/load",
            r#"{"llama_server_spec_draft_n_max": 7}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/ls/load",
            r#"{"llama_server_spec_draft_p_min": 1.5}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/gguf/load",
            r#"{"exllama_cache_size": 8192}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/vl/load",
            r#"{"llama_server_n_ctx": 4096}"#,
            400,
            Some("invalid_load_request"),
        ),
        ("/v1/admin/models/gguf/load", r#"{"replicas": 3}"#, 400, Some("invalid_load_request")),
        // Loads that run.
        ("/v1/admin/models/broken/load", "", 400, Some("load_failed")),
        (
            "/v1/admin/models/gguf/load",
            r#"{"replicas": 2, "gguf_n_ctx": 32768, "gguf_flash_attn": "auto", "gguf_type_k": "q8_0", "gguf_type_v": "q4_0"}"#,
            200,
            None,
        ),
        ("/v1/admin/models/gguf/load", "", 200, None),
        // Overrides sent to a loaded model.
        (
            "/v1/admin/models/gguf/load",
            r#"{"gguf_n_ctx": 8192}"#,
            400,
            Some("invalid_load_request"),
        ),
        (
            "/v1/admin/models/exl/load",
            r#"{"exllama_cache_size": 32768, "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4, "exllama_max_rq_tokens": 32768}"#,
            200,
            None,
        ),
    ];
    for (path, body, status, code) in cases {
        let (got, json) = post(&s, path, body).await;
        assert_eq!(got, *status, "{path} {body}: {json}");
        match code {
            Some(code) => {
                assert_eq!(json["error"]["code"], *code, "{path} {body}: {json}");
                assert!(json["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
            }
            None => assert_eq!(json["runtime_state"], "loaded", "{path} {body}: {json}"),
        }
    }
    // Rejected bodies changed nothing: the models that only got bad bodies are unloaded.
    for name in ["ls", "vl"] {
        assert_eq!(
            get(&s, &format!("/v1/admin/models/{name}")).await.1["runtime_state"],
            "unloaded"
        );
    }
    let (_, broken) = get(&s, "/v1/admin/models/broken").await;
    assert_eq!(broken["runtime_state"], "failed");
    assert!(broken["last_error"].as_str().unwrap().contains("simulated OOM"));
}

#[tokio::test]
async fn loaded_row_reports_override_replicas_and_definition_apart() {
    let s = service(None);
    let body = r#"{"replicas": 2, "gguf_n_ctx": 32768, "gguf_type_k": null}"#;
    let (status, row) = post(&s, "/v1/admin/models/gguf/load", body).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["name"], "gguf");
    assert_eq!(row["resolved_backend"], "llama_cpp");
    assert_eq!((row["replicas"].clone(), row["loaded_replicas"].clone()), (json!(2), json!(2)));
    assert_eq!(row["definition"]["replicas"], 1);
    assert_eq!(row["definition"]["gguf_n_ctx"], 4096);
    assert_eq!(row["load_override"], json!({ "gguf_n_ctx": 32768, "gguf_type_k": null }));
    assert_eq!(
        row["load_constraints"]["gguf_flash_attn"]["allowed_values"],
        json!(["on", "off", "auto"])
    );
    assert_eq!(row["load_recommendations"]["gguf_cache_type_pairs"]["kind"], "pair_presets");
    assert_eq!(row["capabilities"]["modalities"], json!(["text"]));
    for field in [
        "configured_enabled",
        "is_loaded",
        "replica_max",
        "inflight_requests",
        "queue_depth",
        "runtime_inflight",
        "configured_target_inflight",
        "effective_target_inflight",
        "last_error",
        "vram_estimate_mib",
        "vram_estimate_replica_count",
        "vram_estimate_source",
    ] {
        assert!(row.get(field).is_some(), "row lacks {field}");
    }
    let (_, list) = get(&s, "/v1/admin/models").await;
    let names: Vec<_> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["gguf", "exl", "ls", "vl", "stub", "broken"], "config order");
}

#[tokio::test]
async fn unload_rules_and_conflicts() {
    let s = service(None);
    assert_eq!(post(&s, "/v1/admin/models/nope/unload", "").await.0, 404);
    let (status, row) = post(&s, "/v1/admin/models/stub/unload", "").await;
    assert_eq!(
        (status, row["runtime_state"].as_str()),
        (200, Some("unloaded")),
        "already unloaded: 200"
    );
    assert_eq!(post(&s, "/v1/admin/models/stub/load", "").await.0, 200);
    // The stub takes 300 ms to unload: meanwhile a load conflicts and a second unload is 200.
    let unloading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/admin/models/stub/unload", "").await }
    });
    let mut seen_unloading = false;
    for _ in 0..200 {
        let (_, row) = get(&s, "/v1/admin/models/stub").await;
        if row["runtime_state"] == "unloading" {
            seen_unloading = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(seen_unloading);
    let (status, err) = post(&s, "/v1/admin/models/stub/load", "").await;
    assert_eq!((status, err["error"]["code"].as_str()), (409, Some("state_conflict")));
    assert_eq!(err["error"]["runtime_state"], "unloading", "{err}");
    let (status, row) = post(&s, "/v1/admin/models/stub/unload", "").await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloading")));
    let (status, row) = unloading.await.unwrap();
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")));
}

#[tokio::test]
async fn gpu_memory_reports_no_gpus_with_a_reason_and_every_model() {
    let s = service(None);
    let (status, body) = get(&s, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200);
    assert_eq!(body["gpus"], json!([]));
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("unavailable") && error.contains("no GPU probe"), "{body}");
    assert_eq!(body["models"].as_array().unwrap().len(), 6);
    assert_eq!(body["models"][0]["vram_estimate_source"], "unavailable");
}

/// A probe with one scripted GPU whose used memory grows by 100 MiB per read.
struct GrowingGpu(std::sync::atomic::AtomicU64);

impl hangar_runtime::GpuProbe for GrowingGpu {
    fn read(&self) -> Result<Vec<hangar_runtime::GpuReading>, hangar_runtime::GpuUnavailable> {
        let used = self.0.fetch_add(100, std::sync::atomic::Ordering::SeqCst);
        Ok(vec![hangar_runtime::GpuReading {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            used_mib: used,
            total_mib: 81559,
            // This process serves the models in process: its memory is the in-process
            // engines', held by no model the readings can tell apart.
            processes: vec![hangar_runtime::GpuProcess {
                pid: std::process::id(),
                used_mib: Some(250),
            }],
        }])
    }
}

#[tokio::test]
async fn gpu_memory_lists_what_the_probe_reads_each_time_it_is_asked() {
    let s = server()
        .models(json!({ "stub": { "backend": "stub" } }))
        .gpu_probe(Arc::new(GrowingGpu(std::sync::atomic::AtomicU64::new(1000))))
        .build();
    let (status, body) = get(&s, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["gpus"],
        json!([{ "index": 0, "name": "NVIDIA H100 80GB HBM3", "used_mib": 1000, "total_mib": 81559,
                 "used_over_total": "1000MiB / 81559MiB",
                 "holders": [{ "model": null, "mib": 250 }] }])
    );
    assert_eq!(body["error"], Value::Null);
    let (_, body) = get(&s, "/v1/admin/gpu-memory").await;
    assert_eq!(body["gpus"][0]["used_mib"], 1100, "read again, not cached: {body}");
}

#[tokio::test]
async fn a_gpu_models_load_delta_is_its_estimate_in_the_row_and_in_metrics() {
    // Read before the load (1,000 MiB) and after it (1,100 MiB): the load took 100 MiB.
    let s = server()
        .models(json!({ "stub": { "backend": "stub", "device": "gpu" } }))
        .gpu_probe(Arc::new(GrowingGpu(std::sync::atomic::AtomicU64::new(1000))))
        .build();
    let (status, row) = post(&s, "/v1/admin/models/stub/load", "").await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["vram_estimate_mib"], 100, "{row}");
    assert_eq!(row["vram_estimate_source"], "observed_load_delta", "{row}");
    let (_, body) = get(&s, "/v1/admin/gpu-memory").await;
    assert_eq!(body["models"][0]["vram_estimate_source"], "observed_load_delta", "{body}");
    let text = metrics(&s).await;
    let line = r#"hangar_model_vram_estimate_bytes{model="stub",source="observed_load_delta",replicas="1"} 104857600"#;
    assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
}

#[tokio::test]
async fn admin_key_is_required_when_configured() {
    let s = service(Some("sekrit"));
    let (status, body) = get(&s, "/v1/admin/models").await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")));
    let wrong = request(Method::GET, "/v1/admin/models").bearer("wrong").send(&s).await;
    let (status, body) = (wrong.status, wrong.body);
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    let right = request(Method::GET, "/v1/admin/models").bearer("sekrit").send(&s).await;
    assert_eq!(right.status, 200);
    // Non-admin routes stay open.
    assert_eq!(get(&s, "/healthz").await.0, 200);
}

#[tokio::test]
async fn oversized_bodies_unknown_routes_and_wrong_methods() {
    let s = service(None);
    let big = format!(r#"{{"gguf_n_ctx": 8192, "pad": "{}"}}"#, "x".repeat(5000));
    let (status, body) = post(&s, "/v1/admin/models/gguf/load", &big).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("payload_too_large")));
    assert_eq!(get(&s, "/v1/admin/models/gguf").await.1["runtime_state"], "unloaded");
    let (status, body) = get(&s, "/v1/nothing").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
    let (status, body) = call(&s, Method::DELETE, "/v1/admin/models", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (405, Some("method_not_allowed")));
}

#[tokio::test]
async fn malformed_json_answers_422_with_the_parser_position() {
    let s = service(None);
    let (status, body) = post(&s, "/v1/admin/models/gguf/load", "{\n  \"gguf_n_ctx\": ,\n}").await;
    assert_eq!(status, 422);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 2 column"), "{message}");
}

#[tokio::test]
async fn healthz_health_and_readyz() {
    let s = server()
        .models(json!({ "a": { "backend": "stub", "enabled": true }, "b": { "backend": "stub" } }))
        .build();
    let (status, body) = get(&s, "/readyz").await;
    assert_eq!((status, body["not_loaded"].clone()), (503, json!(["a"])));
    s.manager().load_enabled().await;
    assert_eq!(get(&s, "/readyz").await.0, 200);
    assert_eq!(get(&s, "/healthz").await.1["status"], "ok");
    // The name routers probe (vLLM's, SGLang's, llama-server's), while a model is not loaded.
    s.manager().unload("a").await.unwrap();
    let (status, body) = get(&s, "/health").await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    assert!(body["uptime_seconds"].is_u64(), "{body}");
}

/// Admin operations on one model run one at a time; one that cannot start within
/// `admin_lock_timeout_s` answers 503 `admin_busy` and changes nothing. A load of a model
/// that is loading is no such operation: it joins the load in progress.
#[tokio::test]
async fn admin_operations_on_a_model_wait_for_each_other_at_most_the_lock_timeout() {
    let s = server()
        .settings(json!({ "admin_lock_timeout_s": 1 }))
        .models(json!({
            "slow": { "backend": "stub", "stub": { "load_delay_ms": 2500, "unload_delay_ms": 300 } }
        }))
        .build();
    let first = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/admin/models/slow/load", "").await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // An unload while loading is a state conflict, answered at once.
    let (status, body) = post(&s, "/v1/admin/models/slow/unload", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("state_conflict")), "{body}");
    // A second load joins the load in progress and answers with it (the spec's "200 if the
    // model is already loaded or loading"), however long that takes.
    let second_load = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/admin/models/slow/load", "").await }
    });
    // An operation that needs the model to itself waits for the load's lock, and gives up
    // after a second.
    let started = std::time::Instant::now();
    let (status, body) = post(&s, "/v1/admin/models/slow/pause", "{}").await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("admin_busy")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("'slow'"), "{body}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(first.await.unwrap().0, 200, "the first load went on");
    let (status, row) = second_load.await.unwrap();
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");

    // Two unloads at once: both answer once the model is unloaded (the lock's waiter
    // checks the state again when it gets the lock).
    let second = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/admin/models/slow/unload", "").await }
    });
    let (status, row) = post(&s, "/v1/admin/models/slow/unload", "").await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
    let (status, row) = second.await.unwrap();
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("unloaded")), "{row}");
}
