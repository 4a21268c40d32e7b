//! The shipped fixtures: the demo config merges as documented, and every invalid config
//! produces exactly the errors its `expected.txt` lists.

use std::path::{Path, PathBuf};

use hangar_config::{Config, ConfigError, Device, ModelType, config_schema};
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Renders an error the way `expected.txt` spells it: one problem per line, file paths
/// reduced to the file name.
fn render(err: &ConfigError) -> Vec<String> {
    let file = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    match err {
        ConfigError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
        ConfigError::Parse { path, line, column, message } => {
            vec![format!("{}:{line}:{column}: {message}", file(path))]
        }
        ConfigError::Read { path, .. } => vec![format!("cannot read {}", file(path))],
        other => vec![other.to_string()],
    }
}

#[test]
fn every_invalid_fixture_produces_its_exact_errors() {
    let mut cases: Vec<_> = std::fs::read_dir(fixtures().join("invalid"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(cases.len() >= 10, "expected the invalid fixture set, found {}", cases.len());
    for case in cases {
        let expected = std::fs::read_to_string(case.join("expected.txt"))
            .unwrap_or_else(|e| panic!("{}: no expected.txt: {e}", case.display()));
        let expected: Vec<_> = expected.lines().filter(|l| !l.is_empty()).collect();
        assert!(!expected.is_empty(), "{}: expected.txt is empty", case.display());
        let err = Config::load(&case)
            .map(|_| ())
            .expect_err(&format!("{} should be rejected", case.display()));
        assert_eq!(render(&err), expected, "{}", case.display());
    }
}

#[test]
fn demo_config_merges_local_over_settings() {
    let config = Config::load(&fixtures().join("demo")).unwrap();
    let def = |name: &str| config.model(name).unwrap().definition();

    // local.json overrides one key of a nested object and keeps its siblings.
    assert_eq!(def("chat")["stub"]["token_latency_ms"], 5);
    assert_eq!(def("chat")["stub"]["load_delay_ms"], 200);
    // local.json disables a model that settings.json enables.
    assert!(config.model("chat").unwrap().enabled);
    assert!(!config.model("chat-slow").unwrap().enabled);
    // An explicit null in local.json resets a configured value.
    assert_eq!(def("qwen3-exllama")["exllama_cache_quant"], Value::Null);
    assert_eq!(def("qwen3-exllama")["exllama_cache_size"], 32768);
    // Arrays replace rather than concatenate.
    assert_eq!(
        def("qwen3-llama-server")["llama_server_extra_args"],
        json!(["--jinja", "--no-webui"])
    );
    // Objects merge key by key at the top level too.
    assert_eq!(config.max_loaded_models.llm.get(), 7);
    assert_eq!(config.max_loaded_models.embedding.get(), 3);
    assert_eq!(config.max_loaded_models.reranking.get(), 2);
    // Types come from labels; devices from the backend.
    assert_eq!(config.model("embed").unwrap().model_type, ModelType::Embedding);
    assert_eq!(config.model("rerank").unwrap().model_type, ModelType::Reranking);
    assert_eq!(config.model("chat").unwrap().model_type, ModelType::Llm);
    assert_eq!(config.model("tiny-llama-gguf").unwrap().device, Device::GPU);
    assert_eq!(config.model("remote-gpt").unwrap().device, Device::empty());
}

#[test]
fn demo_config_has_a_model_of_every_backend() {
    let config = Config::load(&fixtures().join("demo")).unwrap();
    for kind in hangar_config::BackendKind::ALL {
        assert!(config.models.iter().any(|m| m.backend == kind), "no {kind} model in the demo");
    }
}

#[test]
fn schema_accepts_the_demo_and_rejects_what_validation_rejects() {
    let schema = config_schema();
    let validator = jsonschema::draft202012::new(&schema).expect("the schema itself is valid");
    let demo = hangar_config::read_merged(&fixtures().join("demo")).unwrap();
    let problems: Vec<_> = validator.iter_errors(&demo).map(|e| e.to_string()).collect();
    assert!(problems.is_empty(), "demo does not match the schema: {problems:#?}");

    for bad in [
        json!({ "models": { "q": { "backend": "llama_cpp", "exllama_cache_size": 256 } } }),
        json!({ "models": { "q": { "backend": "llama_cpp", "gguf_nctx": 1 } } }),
        json!({ "models": { "q": { "backend": "llama_cpp", "gguf_type_k": "q8-0" } } }),
        json!({ "models": { "q": { "model_path": "x" } } }),
        json!({ "models": { "a/b": { "backend": "stub" } } }),
        json!({ "port": "eighty" }),
        json!({ "max_loaded_models": { "lm": 1 } }),
    ] {
        assert!(!validator.is_valid(&bad), "schema accepted {bad}");
    }
}

#[test]
fn effective_config_redacts_secrets() {
    let config = Config::from_value(&json!({
        "admin_api_key": "admin-secret",
        "models": {
            "r": { "backend": "openai_remote", "openai_base_url": "https://x/v1", "openai_api_key": "sk-secret" }
        }
    }))
    .unwrap();
    let shown = config.to_effective_json().to_string();
    assert!(!shown.contains("admin-secret") && !shown.contains("sk-secret"), "{shown}");
    assert_eq!(config.admin_api_key.as_ref().unwrap().expose(), "admin-secret");
}

#[test]
fn null_model_entry_removes_a_shipped_model() {
    let merged = hangar_config::merged(
        json!({ "models": { "a": { "backend": "stub" }, "b": { "backend": "stub" } } }),
        json!({ "models": { "b": null } }),
    );
    let config = Config::from_value(&merged).unwrap();
    let names: Vec<_> = config.models.iter().map(|m| m.name.to_string()).collect();
    assert_eq!(names, ["a"]);
}

#[test]
fn quarantine_defaults_and_bad_values() {
    let config = Config::from_value(&json!({})).unwrap();
    assert_eq!(config.quarantine, hangar_config::QuarantinePolicy::default());
    assert_eq!(config.quarantine.failures.get(), hangar_config::DEFAULT_QUARANTINE_FAILURES);

    let set =
        json!({ "quarantine": { "failures": 2, "window_seconds": 60, "backoff_seconds": 5 } });
    let q = Config::from_value(&set).unwrap().quarantine;
    assert_eq!((q.failures.get(), q.window.as_secs(), q.backoff.as_secs()), (2, 60, 5));
    let max = hangar_config::DEFAULT_QUARANTINE_MAX_BACKOFF_S;
    assert_eq!(q.max_backoff.as_secs(), max);
    let shown = Config::from_value(&set).unwrap().to_effective_json();
    assert_eq!(shown["quarantine"]["backoff_seconds"], 5);

    for (bad, path) in [
        (json!({ "quarantine": { "failures": 0 } }), "quarantine.failures"),
        (json!({ "quarantine": { "fails": 2 } }), "quarantine.fails"),
        (
            json!({ "quarantine": { "backoff_seconds": 60, "max_backoff_seconds": 10 } }),
            "quarantine.max_backoff_seconds",
        ),
        (json!({ "max_loaded_models": { "llm": 0 } }), "max_loaded_models.llm"),
    ] {
        let Err(hangar_config::ConfigError::Invalid(errors)) = Config::from_value(&bad) else {
            panic!("accepted {bad}");
        };
        assert!(errors.iter().any(|e| e.path == path), "{bad}: {errors:?}");
    }
}

#[test]
fn limits_defaults_exceed_openai_maxima_and_bad_values_are_refused() {
    let limits = Config::from_value(&json!({})).unwrap().limits;
    assert_eq!(limits, hangar_config::Limits::default());
    // A request OpenAI accepts is never refused: 2,048 embedding inputs and chat messages,
    // 128 tools, 4 stop sequences.
    assert!(limits.max_embedding_inputs.get() > 2_048);
    assert!(limits.max_messages.get() > 2_048);
    assert!(limits.max_tools.get() > 128);
    assert!(limits.max_stop_sequences.get() > 4);
    assert_eq!(limits.request_timeout, None);

    let set = json!({ "limits": { "max_tools": 3, "request_timeout_s": 30 } });
    let config = Config::from_value(&set).unwrap();
    assert_eq!(config.limits.max_tools.get(), 3);
    assert_eq!(config.limits.request_timeout, Some(std::time::Duration::from_secs(30)));
    assert_eq!(config.limits.max_messages.get(), hangar_config::DEFAULT_MAX_MESSAGES);
    let shown = config.to_effective_json();
    assert_eq!(shown["limits"]["max_tools"], 3);
    assert_eq!(shown["limits"]["request_timeout_s"], 30);
    assert_eq!(
        shown["limits"]["max_embedding_inputs"],
        hangar_config::DEFAULT_MAX_EMBEDDING_INPUTS
    );
    let unset = Config::from_value(&json!({})).unwrap().to_effective_json();
    assert_eq!(unset["limits"]["request_timeout_s"], Value::Null);

    let validator = jsonschema::draft202012::new(&config_schema()).unwrap();
    assert!(validator.is_valid(&set));
    for (bad, path) in [
        (json!({ "limits": { "max_tools": 0 } }), "limits.max_tools"),
        (json!({ "limits": { "request_timeout_s": 0 } }), "limits.request_timeout_s"),
        (json!({ "limits": { "max_stop_sequences": -1 } }), "limits.max_stop_sequences"),
        (json!({ "limits": { "max_tool": 3 } }), "limits.max_tool"),
    ] {
        let Err(hangar_config::ConfigError::Invalid(errors)) = Config::from_value(&bad) else {
            panic!("accepted {bad}");
        };
        assert!(errors.iter().any(|e| e.path == path), "{bad}: {errors:?}");
        assert!(!validator.is_valid(&bad), "schema accepted {bad}");
    }
}

#[test]
fn connection_limits_have_defaults_are_shown_and_checked() {
    let config = Config::from_value(&json!({})).unwrap();
    assert_eq!(config.connections, hangar_config::ConnectionLimits::default());
    let c = config.connections;
    assert_eq!(c.max_connections.get(), hangar_config::DEFAULT_MAX_CONNECTIONS);
    assert_eq!(c.header_read_timeout.as_secs(), hangar_config::DEFAULT_HEADER_READ_TIMEOUT_S);
    assert_eq!(c.body_read_timeout.as_secs(), hangar_config::DEFAULT_BODY_READ_TIMEOUT_S);
    assert_eq!(c.idle_timeout.as_secs(), hangar_config::DEFAULT_IDLE_TIMEOUT_S);

    let set = json!({ "connections": { "max_connections": 8, "header_read_timeout_s": 2 } });
    let config = Config::from_value(&set).unwrap();
    assert_eq!(config.connections.max_connections.get(), 8);
    assert_eq!(config.connections.header_read_timeout.as_secs(), 2);
    let shown = config.to_effective_json();
    assert_eq!(
        shown["connections"],
        json!({
            "max_connections": 8,
            "header_read_timeout_s": 2,
            "body_read_timeout_s": hangar_config::DEFAULT_BODY_READ_TIMEOUT_S,
            "idle_timeout_s": hangar_config::DEFAULT_IDLE_TIMEOUT_S,
            "max_keyless_streams": hangar_config::DEFAULT_MAX_KEYLESS_STREAMS,
            "max_refused_calls": hangar_config::DEFAULT_MAX_REFUSED_CALLS,
        })
    );
    let schema = config_schema();
    let props = &schema["properties"]["connections"];
    let text = props.to_string();
    for key in ["max_connections", "header_read_timeout_s", "body_read_timeout_s", "idle_timeout_s"]
    {
        assert!(text.contains(key), "the schema lacks connections.{key}: {props}");
    }

    for (bad, path) in [
        (json!({ "connections": { "max_connections": 0 } }), "connections.max_connections"),
        (
            json!({ "connections": { "header_read_timeout_s": 0 } }),
            "connections.header_read_timeout_s",
        ),
        (json!({ "connections": { "body_read_timeout_s": 0 } }), "connections.body_read_timeout_s"),
        (json!({ "connections": { "idle_timeout_s": 0 } }), "connections.idle_timeout_s"),
        (json!({ "connections": { "max_conections": 5 } }), "connections.max_conections"),
        (json!({ "connections": { "max_connections": -1 } }), "connections.max_connections"),
    ] {
        let Err(ConfigError::Invalid(errors)) = Config::from_value(&bad) else {
            panic!("accepted {bad}");
        };
        assert!(errors.iter().any(|e| e.path == path), "{bad}: {errors:?}");
    }
}

/// Found by the `config` fuzz target (`fuzz/regressions/config/`): a remote model's
/// `openai_api_key_env` (any non-empty string) used to be listed in the effective
/// `children.secret_env`, where it is not a valid pattern, so the effective config failed
/// its own validation. It is withheld from children, and not shown as the operator's list.
#[test]
fn a_remote_key_variable_is_withheld_but_the_effective_config_still_validates() {
    let config = Config::from_value(&json!({
        "children": { "secret_env": ["HF_TOKEN"] },
        "models": {
            "r": { "backend": "openai_remote", "openai_base_url": "https://x/v1", "openai_api_key_env": "REMO@E_API_KEY" }
        }
    }))
    .unwrap();
    assert_eq!(config.children.key_vars, ["REMO@E_API_KEY"]);
    let effective = config.to_effective_json();
    assert_eq!(effective["children"]["secret_env"], json!(["HF_TOKEN"]));
    Config::from_value(&effective).expect("the effective config validates again");
    // A key variable that the built-in list would pass is withheld.
    let config = Config::from_value(&json!({
        "models": {
            "r": { "backend": "openai_remote", "openai_base_url": "https://x/v1", "openai_api_key_env": "HF_API_KEY" }
        }
    }))
    .unwrap();
    assert!(!config.children.passes("HF_API_KEY"));
    assert!(config.children.passes("HF_HOME"));
}
