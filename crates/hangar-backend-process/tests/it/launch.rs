//! The command lines Hangar builds for `llama-server` and `vllm serve`: every configured
//! field and load override lands on its flag, the API key travels in the environment, and
//! a missing binary or model file is a not-found load error.

use hangar_backend::LoadError;
use hangar_backend_process::launch::{self, Launch};
use hangar_config::{ModelConfig, ModelName};
use serde_json::{Value, json};

/// An existing file to stand in for a binary or model (the test's own executable).
fn existing() -> String {
    std::env::current_exe().unwrap().to_string_lossy().into_owned()
}

fn model(value: Value) -> ModelConfig {
    ModelConfig::parse(&ModelName::new("m").unwrap(), &value).expect("valid model")
}

fn llama(extra: Value) -> Result<Launch, LoadError> {
    let mut value = json!({
        "backend": "llama_server",
        "model_path": existing(),
        "llama_server_binary_path": existing(),
    });
    for (k, v) in extra.as_object().unwrap() {
        value[k] = v.clone();
    }
    launch::llama_server(&model(value), 0, 4321)
}

fn vllm(extra: Value) -> Result<Launch, LoadError> {
    let mut value = json!({ "backend": "vllm_serve", "vllm_binary_path": existing() });
    for (k, v) in extra.as_object().unwrap() {
        value[k] = v.clone();
    }
    launch::vllm_serve(&model(value), 0, 4321, Some(std::path::Path::new(SOCKET)))
}

/// The private socket a `vllm serve` child is given.
const SOCKET: &str = "/run/hangar/vllm.sock";

fn args(launch: &Launch) -> Vec<&str> {
    launch.args.iter().map(String::as_str).collect()
}

#[test]
fn llama_server_argv_has_every_configured_field_on_its_flag() {
    let file = existing();
    let launch = llama(json!({
        "target_inflight": 3,
        "llama_server_n_ctx": 4096,
        "llama_server_mmproj": file,
        "llama_server_draft_model": file,
        "llama_server_n_gpu_layers": -1,
        "llama_server_flash_attn": "on",
        "llama_server_reasoning": "off",
        "llama_server_image_max_tokens": 512,
        "llama_server_spec_type": "draft-mtp",
        "llama_server_spec_draft_n_max": 4,
        "llama_server_spec_draft_p_min": 0.25,
        "llama_server_api_key": "k3y",
        "llama_server_library_path": "/opt/lib",
        "llama_server_extra_args": ["--jinja", "--no-webui"],
    }))
    .unwrap();
    let f = file.as_str();
    assert_eq!(
        args(&launch),
        [
            "-m",
            f,
            "--host",
            "127.0.0.1",
            "--port",
            "4321",
            "--alias",
            "m",
            "-c",
            "4096",
            "--parallel",
            "3",
            "--kv-unified",
            "--mmproj",
            f,
            "--model-draft",
            f,
            "--n-gpu-layers",
            "all",
            "--flash-attn",
            "on",
            "--reasoning",
            "off",
            "--image-max-tokens",
            "512",
            "--spec-type",
            "draft-mtp",
            "--spec-draft-n-max",
            "4",
            "--spec-draft-p-min",
            "0.25",
            "--jinja",
            "--no-webui",
        ]
    );
    assert_eq!(launch.env, [("LLAMA_API_KEY".to_owned(), "k3y".to_owned())]);
    assert!(!launch.command_line().contains("k3y"), "the key is never in argv");
    assert_eq!(launch.library_path.as_deref(), Some("/opt/lib"));
    assert_eq!(launch.base_url(), "http://127.0.0.1:4321/v1");
}

#[test]
fn llama_server_minimal_argv_and_model_types() {
    let launch = llama(json!({})).unwrap();
    let f = existing();
    let expected = ["-m", &f, "--host", "127.0.0.1", "--port", "4321", "--alias", "m"];
    assert_eq!(args(&launch), [&expected[..], &["--parallel", "1"]].concat());
    let embed = llama(json!({ "labels": ["embedding"], "llama_server_n_gpu_layers": 12 })).unwrap();
    assert!(args(&embed).ends_with(&["--n-gpu-layers", "12", "--embedding"]), "{:?}", embed.args);
    let rerank = llama(json!({ "type": "reranking" })).unwrap();
    assert_eq!(args(&rerank).last(), Some(&"--reranking"));
}

#[test]
fn a_configured_port_and_host_are_used_and_replicas_take_the_next_ports() {
    let value = json!({
        "backend": "llama_server", "model_path": existing(),
        "llama_server_binary_path": existing(), "llama_server_port": 9000,
        "llama_server_host": "0.0.0.0",
    });
    let second = launch::llama_server(&model(value), 1, 4321).unwrap();
    assert_eq!(second.port, 9001);
    assert!(args(&second).windows(2).any(|w| w == ["--host", "0.0.0.0"]));
    assert_eq!(second.health_url(), "http://127.0.0.1:9001/health");
}

#[test]
fn missing_binaries_and_files_are_not_found_errors_that_say_what_to_do() {
    let missing = llama(json!({ "llama_server_binary_path": "/nonexistent/llama-server" }));
    let Err(LoadError::NotFound { path, message }) = missing else { panic!("{missing:?}") };
    assert_eq!(path, "/nonexistent/llama-server");
    assert!(
        message.contains("llama_server_binary_path")
            && message.contains("cargo xtask llama-server"),
        "{message}"
    );
    let no_model = llama(json!({ "model_path": "/nonexistent/m.gguf" }));
    assert!(
        matches!(no_model, Err(LoadError::NotFound { ref path, .. }) if path == "/nonexistent/m.gguf")
    );
    let no_mmproj = llama(json!({ "llama_server_mmproj": "/nonexistent/mmproj.gguf" }));
    assert!(
        matches!(no_mmproj, Err(LoadError::NotFound { ref message, .. }) if message.contains("llama_server_mmproj"))
    );
    let not_on_path = vllm(json!({ "vllm_binary_path": "surely-no-such-vllm", "vllm_model": "x" }));
    assert!(
        matches!(not_on_path, Err(LoadError::NotFound { ref message, .. }) if message.contains("on PATH"))
    );
}

#[test]
fn vllm_serve_argv_has_every_engine_field_and_override() {
    let launch = vllm(json!({
        "vllm_model": "Qwen/Qwen3-8B",
        "vllm_max_model_len": 8192,
        "vllm_kv_cache_dtype": "fp8",
        "vllm_kv_cache_memory_bytes": 2147483648u64,
        "vllm_gpu_memory_utilization": 0.2,
        "vllm_dtype": "bfloat16",
        "vllm_tensor_parallel_size": 2,
        "vllm_speculative_method": "mtp",
        "vllm_speculative_model": "google/gemma-4-assistant",
        "vllm_num_speculative_tokens": 3,
        "vllm_mm_processor_kwargs": { "min_pixels": 1024 },
        "vllm_max_pixels": 802816,
        "vllm_env": { "HF_HOME": "/models" },
        "vllm_api_key": "s3cret",
        "vllm_extra_args": ["--enforce-eager"],
        "aliases": ["publishers/default/models/m", "m-latest"],
    }))
    .unwrap();
    assert_eq!(
        args(&launch),
        [
            "serve",
            "Qwen/Qwen3-8B",
            // On its private socket: vLLM's key guards only its `/v1` routes.
            "--uds=/run/hangar/vllm.sock",
            // One name, in the element of its flag: vLLM reads `--served-model-name` with
            // nargs="+", and requests naming an alias are renamed to it.
            "--served-model-name=m",
            "--max-model-len=8192",
            "--kv-cache-dtype=fp8",
            "--kv-cache-memory-bytes=2147483648",
            "--gpu-memory-utilization=0.2",
            "--dtype=bfloat16",
            "--tensor-parallel-size=2",
            r#"--speculative-config={"method":"mtp","model":"google/gemma-4-assistant","num_speculative_tokens":3}"#,
            r#"--mm-processor-kwargs={"min_pixels":1024,"max_pixels":802816}"#,
            "--enforce-eager",
        ]
    );
    assert_eq!(
        launch.env,
        [
            ("HF_HOME".to_owned(), "/models".to_owned()),
            ("VLLM_API_KEY".to_owned(), "s3cret".to_owned()),
            // Development mode off: its routes take no key (on only with sleep mode, on a
            // private socket).
            ("VLLM_SERVER_DEV_MODE".to_owned(), "0".to_owned()),
        ]
    );
    assert_eq!(launch.api_key.as_deref(), Some("s3cret"));
}

#[test]
fn a_vllm_child_listens_on_its_socket_unless_its_host_or_port_is_configured() {
    let on = vllm(json!({ "model_path": "/m" })).unwrap();
    assert_eq!(on.socket.as_deref(), Some(std::path::Path::new(SOCKET)));
    assert!(!args(&on).iter().any(|a| a.starts_with("--port") || a.starts_with("--host")));
    for (field, value, flag) in [
        ("vllm_port", json!(8000), "--port=8000"),
        ("vllm_host", json!("127.0.0.2"), "--host=127.0.0.2"),
    ] {
        let launch = vllm(json!({ "model_path": "/m", field: value })).unwrap();
        assert_eq!(launch.socket, None, "{field}");
        assert!(args(&launch).contains(&flag), "{:?}", args(&launch));
        assert!(!args(&launch).iter().any(|a| a.starts_with("--uds")), "{field}");
    }
    let value =
        json!({ "backend": "vllm_serve", "vllm_binary_path": existing(), "model_path": "/m" });
    let without = launch::vllm_serve(&model(value), 0, 4321, None);
    assert!(
        matches!(&without, Err(LoadError::Refused { message }) if message.contains("Unix socket")),
        "{without:?}"
    );
}

#[test]
fn vllm_serve_targets_model_path_without_vllm_model() {
    let launch = vllm(json!({ "model_path": "/models/gemma" })).unwrap();
    assert_eq!(&args(&launch)[..2], ["serve", "/models/gemma"]);
}

#[test]
fn no_value_becomes_a_flag_of_its_own() {
    // Every string that reaches vLLM's argv, set to something that reads as a flag: each
    // stays inside its own `--flag=value` element.
    let flag = "--trust-remote-code";
    let launch = vllm(json!({
        "model_path": "/m",
        "vllm_kv_cache_dtype": flag,
        "vllm_dtype": flag,
        "vllm_speculative_method": flag,
        "vllm_speculative_model": flag,
        "vllm_mm_processor_kwargs": { "k": flag },
    }))
    .unwrap();
    let argv = args(&launch);
    assert!(argv.iter().all(|a| !a.starts_with("--trust")), "{argv:?}");
    assert!(argv.contains(&"--kv-cache-dtype=--trust-remote-code"), "{argv:?}");
    // What `vllm serve` loads is positional: one that reads as a flag is refused.
    let refused = vllm(json!({ "model_path": "--api-key" }));
    assert!(
        matches!(&refused, Err(LoadError::Refused { message }) if message.contains("must not start with `-`")),
        "{refused:?}"
    );
}

#[test]
fn without_a_configured_key_each_child_gets_a_fresh_random_one_in_its_environment_only() {
    for (launches, var) in [
        ([llama(json!({})).unwrap(), llama(json!({})).unwrap()], "LLAMA_API_KEY"),
        (
            [
                vllm(json!({ "model_path": "/m" })).unwrap(),
                vllm(json!({ "model_path": "/m" })).unwrap(),
            ],
            "VLLM_API_KEY",
        ),
    ] {
        let keys: Vec<&str> = launches.iter().map(|l| l.api_key.as_deref().unwrap()).collect();
        for (launch, key) in launches.iter().zip(&keys) {
            assert_eq!(key.len(), 64, "32 random bytes in hex: {key}");
            assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(launch.env.iter().filter(|(k, v)| k == var && v == key).count(), 1);
            assert!(!launch.args.iter().any(|a| a.contains(key)), "{:?}", launch.args);
            assert!(!launch.command_line().contains(key));
        }
        assert_ne!(keys[0], keys[1], "two children share a key");
    }
    // A `VLLM_API_KEY` in `vllm_env` does not override the child's key.
    let launch =
        vllm(json!({ "model_path": "/m", "vllm_env": { "VLLM_API_KEY": "weak" } })).unwrap();
    let keys: Vec<&str> =
        launch.env.iter().filter(|(k, _)| k == "VLLM_API_KEY").map(|(_, v)| v.as_str()).collect();
    assert_eq!(keys, [launch.api_key.as_deref().unwrap()]);
}

#[test]
fn a_split_model_is_told_to_split_evenly_unless_its_extra_args_say_how() {
    let split = llama(json!({ "device": "gpu", "gpu_split": 3 })).unwrap();
    let at = args(&split).iter().position(|a| *a == "--tensor-split").expect("--tensor-split");
    assert_eq!(args(&split)[at + 1], "1,1,1");
    let own = llama(json!({ "gpu_split": 2, "llama_server_extra_args": ["-ts", "3,1"] })).unwrap();
    assert_eq!(args(&own).iter().filter(|a| **a == "--tensor-split").count(), 0, "{own:?}");
    assert!(!args(&llama(json!({})).unwrap()).contains(&"--tensor-split"));

    let tp = |launch: &Launch| {
        let args = args(launch);
        args.iter().find_map(|a| a.strip_prefix("--tensor-parallel-size=")).map(str::to_owned)
    };
    let m = json!({ "vllm_model": "org/m", "gpu_split": 2 });
    assert_eq!(tp(&vllm(m).unwrap()).as_deref(), Some("2"));
    let m = json!({ "vllm_model": "org/m", "vllm_tensor_parallel_size": 4 });
    assert_eq!(tp(&vllm(m).unwrap()).as_deref(), Some("4"), "said once");
    let m = json!({ "vllm_model": "org/m", "gpu_split": 2, "vllm_extra_args": ["-tp=2"] });
    assert_eq!(tp(&vllm(m).unwrap()), None, "the operator's own flag is kept alone");
    assert_eq!(tp(&vllm(json!({ "vllm_model": "org/m" })).unwrap()), None);
}

#[test]
fn a_placement_reaches_the_child_as_cuda_visible_devices_in_pci_bus_order() {
    let env = |pairs: Vec<(String, String)>| -> Vec<(String, String)> { pairs };
    assert_eq!(
        hangar_backend::cuda_environment(&[1, 3], &[]),
        env(vec![
            ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "1,3".into()),
        ])
    );
    assert!(hangar_backend::cuda_environment(&[], &[]).is_empty(), "no placement");
    let own = [("CUDA_VISIBLE_DEVICES".to_owned(), "GPU-8d1c".to_owned())];
    assert!(hangar_backend::cuda_environment(&[0], &own).is_empty(), "a hand-written choice");
}
