//! Hangar's side of the bridge protocol against `tests/worker/test_worker.py`, a worker with
//! no engine (standard-library Python only): every message, cancellation, and every way a
//! worker can break — version mismatch, garbage, a reply nobody asked for, a hung worker,
//! a dead one — each of which must end as a clear load error or a crashed runtime, with the
//! process gone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangar_backend::{
    Backend, ChatMessage, CrashSink, EmbedRequest, FinishReason, GenerateEvent, GenerateRequest,
    LoadError, LoadRequest, Prompt, RerankRequest, Role, Runtime, RuntimeError, ThinkingMode,
};
use hangar_backend_bridge::{BridgeBackend, Timing, WorkerProgram};
use hangar_config::{BackendKind, ModelConfig, ModelName};
use serde_json::{Value, json};
use tokio::sync::mpsc;

fn worker_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/worker/test_worker.py")
}

/// A backend running the test worker in `mode`, with short liveness timings.
fn backend(mode: &str, extra: &[(&str, &str)]) -> BridgeBackend {
    let mut env = vec![("HANGAR_TEST_WORKER".to_owned(), mode.to_owned())];
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    BridgeBackend::new(BackendKind::Ct2)
        .with_worker(WorkerProgram::script(worker_script(), env))
        .with_timing(Timing {
            ping_every: Duration::from_millis(100),
            ping_deadline: Duration::from_millis(600),
            grace: Duration::from_secs(2),
        })
}

/// A `ct2` model over an existing directory, with `extra` fields.
fn model(extra: Value) -> Arc<ModelConfig> {
    let dir = std::env::temp_dir().join("hangar-bridge-test-model");
    std::fs::create_dir_all(&dir).expect("model dir");
    let mut fields = json!({
        "backend": "ct2",
        "model_path": dir.to_string_lossy(),
        "device": "cpu",
        "load_timeout_s": 10,
        "ct2_compute_type": "int8",
        "ct2_intra_threads": 1,
    });
    fields.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let name = ModelName::new("bridge-test").unwrap();
    Arc::new(ModelConfig::parse(&name, &fields).expect("valid model"))
}

/// The crash sink's reports.
fn crash_sink() -> (CrashSink, Arc<Mutex<Vec<String>>>) {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&reports);
    (CrashSink::new(move |reason| seen.lock().unwrap().push(reason)), reports)
}

async fn load(
    backend: &BridgeBackend,
    model: Arc<ModelConfig>,
) -> Result<Arc<dyn Runtime>, LoadError> {
    backend.load(LoadRequest::new(model, 0, 1)).await
}

fn pid(runtime: &Arc<dyn Runtime>) -> i32 {
    runtime.details()["pid"].as_i64().expect("pid in the details") as i32
}

fn alive(pid: i32) -> bool {
    // A reaped child has no /proc entry; a zombie would show state Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.split_whitespace().nth(2).is_none_or(|s| s != "Z"))
}

async fn gone(pid: i32) -> bool {
    for _ in 0..100 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Whether the worker logs a line starting with `prefix` within 5 s (its output is read by
/// another thread, so it may arrive after the reply that followed it).
async fn logged(logs: &hangar_backend::ModelLogs, prefix: &str) -> bool {
    for _ in 0..100 {
        if logs.tail(200).iter().any(|l| l.line.starts_with(prefix)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn chat(text: &str) -> GenerateRequest {
    GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new(Role::User, text)]))
}

/// Runs a generation to its end: the text and the result.
pub(crate) async fn run(
    runtime: &Arc<dyn Runtime>,
    request: GenerateRequest,
) -> (String, Result<hangar_backend::GenerateSummary, RuntimeError>) {
    let (tx, mut rx) = mpsc::channel(16);
    let collect = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(GenerateEvent::Text(t)) = rx.recv().await {
            text.push_str(&t);
        }
        text
    });
    let result = runtime.generate(request, tx).await;
    (collect.await.unwrap(), result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_of_the_protocol_round_trips() {
    let backend = backend("ok", &[]);
    let model = model(json!({"prompt_format": "qwen3_template", "ct2_inter_threads": 2}));
    backend.preflight(&model).await.expect("the test worker's check passes");
    let runtime = load(&backend, Arc::clone(&model)).await.expect("loads");

    // load: the backend's settings (and only set ones), the device and the engine name.
    let details = runtime.details();
    assert_eq!(details["engine_asked"], "ct2");
    assert_eq!(details["device"], "cpu");
    assert_eq!(
        details["settings"],
        json!({"ct2_compute_type": "int8", "ct2_inter_threads": 2, "ct2_intra_threads": 1})
    );
    assert_eq!(details["protocol"], 1);
    assert!(details["worker"].as_str().unwrap().starts_with("test-worker 0"), "{details:?}");
    // The worker's max_parallel_sequences replaces the config's estimate.
    assert_eq!(runtime.capabilities().max_parallel_sequences.map(|n| n.get()), Some(4));
    assert_eq!(runtime.capabilities().thinking_modes.len(), 3, "qwen3 thinks");

    // generate: Hangar rendered the prompt in the model's format, thinking switch included.
    let mut request = chat("hello there");
    request.thinking = ThinkingMode::Disabled;
    let (text, result) = run(&runtime, request).await;
    let summary = result.expect("generates");
    assert!(
        text.starts_with("<|im_start|>user hello there<|im_end|> <|im_start|>assistant"),
        "{text:?}"
    );
    assert!(text.contains("<think>"), "thinking disabled writes an empty think block: {text:?}");
    assert_eq!(summary.finish_reason, FinishReason::Stop);
    assert_eq!(summary.completion_tokens as usize, text.split_whitespace().count());
    // count: the same prompt's tokens, nothing generated.
    let mut request = chat("hello there");
    request.thinking = ThinkingMode::Disabled;
    assert_eq!(runtime.count_tokens(request).await.unwrap(), summary.prompt_tokens);

    // max_tokens ends with `length`; stop sequences are the worker's.
    let mut request = GenerateRequest::new(Prompt::Text("one two three four five".into()));
    request.params.max_tokens = Some(2);
    let (text, result) = run(&runtime, request).await;
    assert_eq!((text.as_str(), result.unwrap().finish_reason), ("one two ", FinishReason::Length));
    let mut request = GenerateRequest::new(Prompt::Text("one two three four".into()));
    request.params.stop = vec!["never".into(), "three".into()];
    let (text, result) = run(&runtime, request).await;
    let summary = result.unwrap();
    assert_eq!((text.as_str(), summary.finish_reason), ("one two ", FinishReason::Stop));
    assert_eq!(summary.stop_sequence, Some(1), "the stop sequence met is named");

    // embed and rerank.
    let embeddings = runtime.embed(EmbedRequest { inputs: vec!["ab".into(), "abc".into()] }).await;
    assert_eq!(embeddings.unwrap().vectors, vec![vec![0.0, 1.0], vec![1.0, 0.0]]);
    let rerank = RerankRequest {
        query: "red fox".into(),
        documents: vec!["a red fox".into(), "blue sky".into()],
    };
    assert_eq!(runtime.rerank(rerank).await.unwrap().scores, vec![2.0, 0.0]);
    runtime.health().await.expect("alive");

    // unload + shutdown: the worker exits on its own, and says it was unloaded first.
    let pid = pid(&runtime);
    runtime.unload().await;
    assert!(gone(pid).await, "the worker {pid} outlived its unload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_format_auto_sends_the_messages_for_the_engines_own_template() {
    let backend = backend("ok", &[]);
    let runtime = load(&backend, model(json!({}))).await.expect("loads");
    let mut request = chat("hi");
    request.thinking = ThinkingMode::Default;
    let (text, result) = run(&runtime, request).await;
    result.unwrap();
    let echoed: Value = serde_json::from_str(text.replace("} ", "}").trim()).unwrap_or_else(|e| {
        panic!("the worker echoes the messages as JSON ({e}): {text:?}");
    });
    assert_eq!(echoed["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(echoed["thinking"], "default");
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_generation_in_the_worker() {
    let backend = backend("ok", &[("HANGAR_TEST_TOKEN_MS", "20")]);
    let model = model(json!({}));
    let logs = hangar_backend::ModelLogs::default();
    let mut request = LoadRequest::new(model, 0, 1);
    request.logs = logs.clone();
    let runtime = backend.load(request).await.expect("loads");
    let (tx, mut rx) = mpsc::channel(1);
    let generation = {
        let runtime = Arc::clone(&runtime);
        tokio::spawn(async move {
            runtime.generate(GenerateRequest::new(Prompt::Text("tick".into())), tx).await
        })
    };
    for _ in 0..3 {
        assert_eq!(rx.recv().await, Some(GenerateEvent::Text("tick ".into())));
    }
    drop(rx);
    let result = tokio::time::timeout(Duration::from_secs(5), generation).await;
    assert_eq!(result.expect("ends promptly").unwrap(), Err(RuntimeError::Cancelled));
    assert!(
        logged(&logs, "cancelled request").await,
        "the worker stopped the generation: {:?}",
        logs.tail(50)
    );
    runtime.health().await.expect("the worker serves on");
    let (text, result) =
        run(&runtime, GenerateRequest::new(Prompt::Text("still here".into()))).await;
    assert_eq!((text.as_str(), result.is_ok()), ("still here ", true));
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_generation_is_cancelled_too() {
    let backend = backend("ok", &[("HANGAR_TEST_TOKEN_MS", "20")]);
    let logs = hangar_backend::ModelLogs::default();
    let mut request = LoadRequest::new(model(json!({})), 0, 1);
    request.logs = logs.clone();
    let runtime = backend.load(request).await.expect("loads");
    let (tx, _rx) = mpsc::channel(64);
    let generate = runtime.generate(GenerateRequest::new(Prompt::Text("tick".into())), tx);
    assert!(tokio::time::timeout(Duration::from_millis(200), generate).await.is_err());
    let said = logged(&logs, "cancelled request").await;
    assert!(said, "the dropped generation was cancelled in the worker: {:?}", logs.tail(50));
    runtime.unload().await;
}

/// A load that must fail: its message, and no worker left behind.
async fn failed_load(mode: &str, extra: Value) -> LoadError {
    let backend = backend(mode, &[]);
    let logs = hangar_backend::ModelLogs::default();
    let mut request = LoadRequest::new(model(extra), 0, 1);
    request.logs = logs.clone();
    let error = match backend.load(request).await {
        Ok(_) => panic!("a `{mode}` worker must not load"),
        Err(e) => e,
    };
    let started = logs.tail(50).iter().find_map(|l| {
        l.line.strip_prefix("started pid ").and_then(|r| r.split(':').next()?.parse::<i32>().ok())
    });
    let pid = started.expect("the worker was started");
    assert!(gone(pid).await, "the `{mode}` worker {pid} outlived its failed load");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_version_mismatch_fails_the_load_naming_both_versions() {
    let error = failed_load("version", json!({})).await;
    let text = error.to_string();
    assert!(matches!(error, LoadError::Failed { .. }), "{error:?}");
    assert!(
        text.contains("worker speaks version 99") && text.contains("speaks version 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_hello_fails_the_load_quoting_it() {
    let text = failed_load("garbage_hello", json!({})).await.to_string();
    assert!(text.contains("not protocol") && text.contains("hello there"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_says_hello_fails_at_the_load_deadline() {
    let text = failed_load("hang_hello", json!({"load_timeout_s": 1})).await.to_string();
    assert!(text.contains("within load_timeout_s"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_load_error_keeps_its_code_and_message() {
    let error = failed_load("load_error", json!({})).await;
    assert!(matches!(error, LoadError::Failed { .. }), "{error:?}");
    assert!(error.to_string().contains("load_failed: simulated: out of memory"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_package_fails_the_preflight_as_not_found() {
    let backend = backend("missing", &[]);
    let error = backend.preflight(&model(json!({}))).await.expect_err("enginepkg is missing");
    assert!(error.is_not_found(), "{error:?}");
    assert!(error.to_string().contains("`enginepkg` is not installed"), "{error}");
    let missing_dir = model(json!({"model_path": "/nonexistent/model"}));
    let error = backend.preflight(&missing_dir).await.expect_err("no such directory");
    assert!(error.is_not_found() && error.to_string().contains("/nonexistent/model"), "{error}");
}

/// Loads a worker in `mode`, runs one generation, and returns its error and the crash
/// report, once the worker is gone.
async fn crash(mode: &str, prompt: &str) -> (RuntimeError, String) {
    let backend = backend(mode, &[("HANGAR_TEST_TOKEN_MS", "10")]);
    let (sink, reports) = crash_sink();
    let mut request = LoadRequest::new(model(json!({})), 0, 1);
    request.crash = sink;
    let runtime = backend.load(request).await.expect("loads");
    let pid = pid(&runtime);
    let request = GenerateRequest::new(Prompt::Text(prompt.into()));
    let (_, result) = tokio::time::timeout(Duration::from_secs(10), run(&runtime, request))
        .await
        .expect("a broken worker ends the request");
    let error = result.expect_err("the worker broke");
    assert!(gone(pid).await, "the `{mode}` worker {pid} is still running");
    for _ in 0..100 {
        let first = reports.lock().unwrap().first().cloned();
        if let Some(report) = first {
            assert!(runtime.health().await.is_err(), "health reports the crash");
            return (error, report);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the `{mode}` worker's crash was not reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_mid_generation_is_a_crash_with_its_exit_and_last_words() {
    let (error, report) = crash("die_generate", "a b c d e").await;
    assert!(
        matches!(&error, RuntimeError::Crashed { reason } if reason == &report),
        "{error:?} / {report}"
    );
    assert!(
        report.contains("exited with status 7") && report.contains("dying on purpose"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_output_is_a_crash_and_the_worker_is_killed() {
    let (error, report) = crash("garbage_generate", "a b").await;
    assert!(matches!(error, RuntimeError::Crashed { .. }), "{error:?}");
    assert!(report.contains("not protocol") && report.contains("Traceback"), "{report}");
    assert!(report.contains("was killed by signal"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_nobody_asked_for_or_a_protocol_error_is_a_crash() {
    let (_, report) = crash("unknown_id", "a b").await;
    assert!(report.contains("request 999, which is not in flight"), "{report}");
    let (_, report) = crash("wrong_reply", "a b").await;
    assert!(report.contains("answered generate with Pong"), "{report}");
    // A worker that cannot read what Hangar sent: the two sides disagree.
    let (_, report) = crash("refuse", "a b").await;
    assert!(report.contains("refused generate as a protocol error: what is this?"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_worker_misses_its_ping_deadline_and_is_a_crash() {
    let (error, report) = crash("hang_after_load", "tick").await;
    assert!(matches!(error, RuntimeError::Crashed { .. }), "{error:?}");
    assert!(report.contains("stopped answering: no pong within 600ms"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_runtime_leaves_no_worker_behind() {
    let backend = backend("ok", &[]);
    let runtime = load(&backend, model(json!({}))).await.expect("loads");
    let pid = pid(&runtime);
    assert!(alive(pid));
    drop(runtime);
    assert!(gone(pid).await, "the worker {pid} outlived its runtime");
}
