//! The decisions the runtime owns rather than the HTTP layer: admission by the request's
//! work before any auto-load, the atomic reload, the idempotent same-options load, a
//! backend that is not compiled in, and a model's default `max_tokens`.

use std::num::NonZeroU32;
use std::sync::Arc;

use async_trait::async_trait;
use hangar_backend::{
    Backend, Capabilities, EmbedRequest, GenerateRequest, LoadError, LoadRequest, Runtime,
    ThinkingMode,
};
use hangar_config::{BackendKind, ModelConfig};
use hangar_runtime::{Backends, ErrorCode, LoadOptions, Manager, ManagerError, Work};
use hangar_stub::StubBackend;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{config, generate, loaded, manager, request, settle, spawn_generate, state};

fn chat(extra: Value) -> Value {
    let mut model = json!({ "backend": "stub" });
    if let (Some(m), Value::Object(extra)) = (model.as_object_mut(), extra) {
        m.extend(extra);
    }
    model
}

/// A manager whose `llama_cpp` models run on a stub the test can watch.
fn llama_manager(models: Value) -> (Manager, Arc<StubBackend>) {
    let llama = Arc::new(StubBackend::with_kind(BackendKind::LlamaCpp));
    let backends = Backends::new().with(llama.clone());
    (Manager::new(&config(json!({ "models": models })), backends), llama)
}

fn overrides(pairs: Value) -> LoadOptions {
    let Value::Object(overrides) = pairs else { panic!("an object") };
    LoadOptions { overrides, ..LoadOptions::default() }
}

#[tokio::test(start_paused = true)]
async fn an_embeddings_request_for_an_llm_with_auto_load_is_refused_and_loads_nothing() {
    let (m, stub) = manager(json!({
        "auto_load": true,
        "models": {
            "chat": chat(json!({})),
            "other": chat(json!({})),
            "embed": chat(json!({ "labels": ["embedding"] })),
        }
    }));
    m.load("other", LoadOptions::default()).await.unwrap();
    let before = stub.loads_started();
    let err = m.embed("chat", EmbedRequest { inputs: vec!["x".into()] }).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ModelTypeMismatch, "{err}");
    assert!(err.to_string().contains("needs a model of type embedding"), "{err}");
    let err = m.admit("embed", Work::Rerank).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ModelTypeMismatch);
    let err = m.generate("embed", request("hi", 2), mpsc::channel(4).0).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ModelTypeMismatch);
    assert_eq!(stub.loads_started(), before, "nothing was loaded");
    assert_eq!(loaded(&m), ["other"], "nothing was evicted");
    // The right work auto-loads as before.
    m.embed("embed", EmbedRequest { inputs: vec!["x".into()] }).await.unwrap();
    assert_eq!(state(&m, "embed"), "loaded");
}

#[tokio::test(start_paused = true)]
async fn thinking_and_turns_are_checked_against_capabilities_before_loading() {
    let (m, stub) = manager(json!({
        "auto_load": true,
        "models": {
            "plain": chat(json!({})),
            "thinker": chat(json!({ "stub": { "thinking": true } })),
        }
    }));
    let thinking = |mode| Work::Generate { thinking: mode, user_turns: 1 };
    for mode in [ThinkingMode::Enabled, ThinkingMode::Disabled] {
        let err = m.admit("plain", thinking(mode)).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::ThinkingUnsupported);
        assert!(err.to_string().contains("thinking_modes are [default]"), "{err}");
    }
    assert_eq!(stub.loads_started(), 0);
    assert!(m.admit("thinker", thinking(ThinkingMode::Enabled)).await.is_ok());
    assert!(m.admit("plain", thinking(ThinkingMode::Default)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_single_turn_model_refuses_several_user_messages_before_loading() {
    let two = Work::Generate { thinking: ThinkingMode::Default, user_turns: 2 };
    let single = Arc::new(SingleTurn(StubBackend::new()));
    let m = Manager::new(
        &config(json!({ "auto_load": true, "models": { "t": chat(json!({})) } })),
        Backends::new().with(single),
    );
    let err = m.admit("t", two).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidRequest);
    assert!(matches!(err, ManagerError::SingleTurn { user_turns: 2, .. }), "{err:?}");
    assert_eq!(state(&m, "t"), "unloaded", "refused before the auto-load");
    let one = Work::Generate { thinking: ThinkingMode::Default, user_turns: 1 };
    assert!(m.admit("t", one).await.is_ok());
    // The multi-turn stub takes both.
    let (m, _) = manager(json!({ "models": { "t": chat(json!({})) } }));
    m.load("t", LoadOptions::default()).await.unwrap();
    assert!(m.admit("t", two).await.is_ok());
}

/// The stub, reporting single-turn capabilities.
struct SingleTurn(StubBackend);

#[async_trait]
impl Backend for SingleTurn {
    fn kind(&self) -> BackendKind {
        self.0.kind()
    }
    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        Capabilities { multi_turn: false, ..self.0.capabilities(model) }
    }
    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        self.0.load(request).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_is_not_compiled_in_fails_before_anything_is_evicted() {
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 1 },
        "models": {
            "chat": chat(json!({})),
            "server": { "backend": "llama_server", "model_path": "/m/x.gguf" },
        }
    }));
    m.load("chat", LoadOptions::default()).await.unwrap();
    let err = m.load("server", LoadOptions::default()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    assert!(err.to_string().contains("llama_server is not available in this build"), "{err}");
    assert_eq!(state(&m, "server"), "failed");
    assert_eq!(loaded(&m), ["chat"], "the slot's holder was not evicted");
    assert_eq!(m.counters().evictions, 0);
}

#[tokio::test(start_paused = true)]
async fn ensure_loaded_with_the_same_options_is_a_no_op_and_load_refuses_them() {
    let (m, stub) = llama_manager(json!({
        "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "replica_max": 2 }
    }));
    let options = LoadOptions {
        replicas: NonZeroU32::new(2),
        ..overrides(json!({ "gguf_n_ctx": 2048, "gguf_type_k": null }))
    };
    m.ensure_loaded("g", options.clone()).await.unwrap();
    let started = stub.loads_started();
    let again = m.ensure_loaded("g", options.clone()).await.unwrap();
    assert_eq!((again.replicas, again.loaded_replicas), (2, 2));
    assert_eq!(stub.loads_started(), started, "nothing was loaded again");
    let other = overrides(json!({ "gguf_n_ctx": 4096 }));
    let err = m.ensure_loaded("g", other).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest, "other options are refused");
    let err = m.load("g", options).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest, "the admin rule: unload first");
}

#[tokio::test(start_paused = true)]
async fn a_reload_with_bad_options_leaves_the_old_runtime_serving() {
    let (m, stub) = llama_manager(json!({
        "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "gguf_n_ctx": 4096 }
    }));
    m.load("g", overrides(json!({ "gguf_n_ctx": 2048 }))).await.unwrap();
    for bad in [json!({ "gguf_n_ctx": 0 }), json!({ "gguf_type_k": "q8-0" }), json!({ "x": 1 })] {
        let err = m.reload("g", overrides(bad.clone())).await.unwrap_err();
        assert!(
            matches!(err.code(), ErrorCode::InvalidRequestBody | ErrorCode::InvalidLoadRequest),
            "{bad}: {err:?}"
        );
    }
    let snap = m.model("g").unwrap();
    assert!(snap.is_loaded);
    assert_eq!(snap.load_override.fields().get("gguf_n_ctx"), Some(&json!(2048)));
    assert_eq!(stub.loads_started(), 1);
    assert!(generate(&m, "g", 3).await.is_ok(), "the old runtime still serves");
}

#[tokio::test(start_paused = true)]
async fn a_reload_swaps_in_new_runtimes_only_once_they_loaded() {
    let (m, stub) = llama_manager(json!({
        "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "replica_max": 2 }
    }));
    m.load("g", LoadOptions::default()).await.unwrap();
    let running = spawn_generate(&m, "g", 40);
    settle().await;
    let reload = tokio::spawn({
        let m = m.clone();
        let options = LoadOptions { replicas: NonZeroU32::new(2), ..LoadOptions::default() };
        async move { m.reload("g", options).await }
    });
    settle().await;
    // While the new runtimes load, the old one keeps admitting requests.
    assert_eq!(state(&m, "g"), "loaded");
    let during = spawn_generate(&m, "g", 2);
    let snap = reload.await.unwrap().unwrap();
    assert_eq!((snap.replicas, snap.loaded_replicas), (2, 2));
    assert!(during.await.unwrap().is_ok());
    assert!(running.await.unwrap().is_ok(), "the running request finished on the old runtime");
    settle().await;
    assert_eq!(stub.live_runtimes(), 2, "the old runtime was released after its drain");
    assert_eq!(m.counters().loads, 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_reload_keeps_the_old_runtime_serving() {
    let failing = Arc::new(FailsOnCtx(StubBackend::with_kind(BackendKind::LlamaCpp)));
    let m = Manager::new(
        &config(json!({ "models": {
            "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "gguf_n_ctx": 4096 }
        } })),
        Backends::new().with(failing),
    );
    m.load("g", LoadOptions::default()).await.unwrap();
    let err = m.reload("g", overrides(json!({ "gguf_n_ctx": 9999 }))).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    assert!(err.to_string().contains("previous runtime keeps serving"), "{err}");
    let snap = m.model("g").unwrap();
    assert!(snap.is_loaded && snap.last_error.is_none());
    assert!(snap.load_override.is_empty(), "the old options stay in effect");
    assert!(generate(&m, "g", 3).await.is_ok());
}

/// The llama.cpp stub, failing every load of a context of 9999 tokens.
struct FailsOnCtx(StubBackend);

#[async_trait]
impl Backend for FailsOnCtx {
    fn kind(&self) -> BackendKind {
        self.0.kind()
    }
    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        self.0.capabilities(model)
    }
    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        let ctx = match &request.model.settings {
            hangar_config::BackendSettings::LlamaCpp(s) => s.gguf_n_ctx,
            _ => None,
        };
        if ctx == Some(9999) {
            return Err(LoadError::Failed { message: "simulated: out of memory".into() });
        }
        self.0.load(request).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_without_max_tokens_gets_the_models_default() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 2 }, "models": {
        "capped": chat(json!({ "default_max_tokens": 3 })),
        "free": chat(json!({})),
    } }));
    for name in ["capped", "free"] {
        m.load(name, LoadOptions::default()).await.unwrap();
    }
    let run = |name: &'static str, max_tokens: Option<u32>| {
        let m = m.clone();
        async move {
            let mut request = request("one two three four five six", 1);
            request.params.max_tokens = max_tokens;
            let (tx, mut rx) = mpsc::channel(256);
            let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
            let tokens = m.generate(name, request, tx).await.unwrap().completion_tokens;
            drain.await.unwrap();
            tokens
        }
    };
    assert_eq!(run("capped", None).await, 3, "the configured default applies");
    assert_eq!(run("capped", Some(5)).await, 5, "the request's own value wins");
    assert!(run("free", None).await > 3, "no default: the engine's own limit");
}

#[test]
fn work_of_a_generation_counts_user_turns() {
    use hangar_backend::{ChatMessage, Prompt, Role};
    let mut request = GenerateRequest::new(Prompt::Chat(vec![
        ChatMessage::new(Role::System, "s"),
        ChatMessage::new(Role::User, "a"),
        ChatMessage::new(Role::Assistant, "b"),
        ChatMessage::new(Role::User, "c"),
    ]));
    request.thinking = ThinkingMode::Enabled;
    assert_eq!(
        Work::generation(&request),
        Work::Generate { thinking: ThinkingMode::Enabled, user_turns: 2 }
    );
    let text = GenerateRequest::new(Prompt::Text("x".into()));
    assert_eq!(
        Work::generation(&text),
        Work::Generate { thinking: ThinkingMode::Default, user_turns: 1 }
    );
}
