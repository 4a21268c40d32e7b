//! vLLM's sleep mode on in-process `vllm` models: a real reference worker process
//! (`worker/hangar_bridge`) with the fake vllm of `worker/tests/fakes` on its path, which
//! keeps vLLM's sleep state (after level 2 it answers garbled text until the weights are
//! reloaded). The model sleeps at both levels and wakes to the same answer, and engines or
//! models without sleep mode say they cannot sleep.
//!
//! The worker runs under `HANGAR_BRIDGE_PYTHON` when set, else `python3` from `PATH` (the
//! fakes need only the standard library).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hangar_backend::{
    Backend, GenerateRequest, LoadRequest, Prompt, Runtime, RuntimeError, SleepLevel,
};
use hangar_backend_bridge::{BridgeBackend, Timing, WorkerProgram};
use hangar_config::{BackendKind, ModelConfig, ModelName};
use serde_json::{Value, json};

/// What the fake engine streams by default (`fake_record.DEFAULT_SCRIPT`).
const ANSWER: &str = "Hello, world!";

fn python() -> String {
    std::env::var("HANGAR_BRIDGE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A scratch directory for one test: the model directory and the fake's call record.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hangar-bridge-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("model")).expect("scratch dir");
    dir
}

/// A `kind` backend running the worker from this crate's sources, the fake engines first on
/// its path, recording the fakes' calls in `dir/calls.jsonl`.
fn backend(kind: BackendKind, dir: &Path) -> BridgeBackend {
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("worker");
    let path = format!("{}:{}", worker.join("tests/fakes").display(), worker.display());
    let program = WorkerProgram {
        args: ["-u", "-B", "-m", "hangar_bridge"].map(String::from).to_vec(),
        env: vec![
            ("PYTHONPATH".into(), path),
            ("FAKE_ENGINE_RECORD".into(), dir.join("calls.jsonl").to_string_lossy().into()),
        ],
    };
    BridgeBackend::new(kind).with_worker(program).with_timing(Timing {
        ping_every: Duration::from_millis(100),
        ping_deadline: Duration::from_secs(10),
        grace: Duration::from_secs(2),
    })
}

/// A model of `backend` over `dir/model`, with `extra` fields.
fn model(backend: &str, dir: &Path, extra: Value) -> Arc<ModelConfig> {
    let mut fields = json!({
        "backend": backend,
        "model_path": dir.join("model").to_string_lossy(),
        "device": "gpu",
        "load_timeout_s": 30,
        "prompt_format": "qwen3_template",
        "bridge_python": python(),
    });
    fields.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let name = ModelName::new("sleepy").unwrap();
    Arc::new(ModelConfig::parse(&name, &fields).expect("valid model"))
}

async fn load(kind: BackendKind, model: Arc<ModelConfig>, dir: &Path) -> Arc<dyn Runtime> {
    let backend = backend(kind, dir);
    backend.load(LoadRequest::new(model, 0, 1)).await.expect("the fake engine loads")
}

/// A greedy answer: its text, or the generation's error.
async fn answer(runtime: &Arc<dyn Runtime>) -> Result<String, RuntimeError> {
    let mut request = GenerateRequest::new(Prompt::Text("hi".into()));
    request.params.temperature = Some(0.0);
    let (text, result) = crate::protocol::run(runtime, request).await;
    result.map(|_| text)
}

/// The fake's calls named `name`, their arguments in order.
fn calls(dir: &Path, name: &str) -> Vec<Value> {
    let record = std::fs::read_to_string(dir.join("calls.jsonl")).unwrap_or_default();
    record
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|call| call["call"] == name)
        .map(|call| call["args"].clone())
        .collect()
}

fn unsupported(result: Result<(), RuntimeError>) -> String {
    match result {
        Err(RuntimeError::Unsupported { message }) => message,
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_model_with_sleep_mode_sleeps_at_both_levels_and_wakes_to_the_same_answer() {
    let dir = scratch("vllm-sleep");
    let model = model("vllm", &dir, json!({ "vllm_enable_sleep_mode": true }));
    let runtime = load(BackendKind::Vllm, model, &dir).await;
    assert_eq!(
        runtime.capabilities().sleep_levels,
        [SleepLevel::WeightsToHost, SleepLevel::WeightsDiscarded]
    );
    let engine_args = calls(&dir, "AsyncEngineArgs");
    assert_eq!(engine_args.len(), 1);
    assert_eq!(engine_args[0]["enable_sleep_mode"], true);
    assert_eq!(answer(&runtime).await.unwrap(), ANSWER);

    // Level 1: asleep, it serves nothing; awake, the same answer, without a reload.
    runtime.sleep(SleepLevel::WeightsToHost).await.expect("sleeps at level 1");
    runtime.sleep(SleepLevel::WeightsToHost).await.expect("asleep already is Ok");
    assert_eq!(calls(&dir, "sleep"), [json!({"level": 1})]);
    let refused = answer(&runtime).await.unwrap_err();
    assert!(matches!(&refused, RuntimeError::Failed { message } if message.contains("asleep")));
    runtime.wake().await.expect("wakes from level 1");
    runtime.wake().await.expect("awake already is Ok");
    assert_eq!(calls(&dir, "wake_up"), [json!({"tags": null})]);
    assert_eq!(answer(&runtime).await.unwrap(), ANSWER);

    // Level 2 discards the weights: the wake reloads them between waking the weights and the
    // KV cache, or the fake would answer garbage.
    runtime.sleep(SleepLevel::WeightsDiscarded).await.expect("sleeps at level 2");
    runtime.wake().await.expect("wakes from level 2");
    assert_eq!(answer(&runtime).await.unwrap(), ANSWER);
    assert_eq!(calls(&dir, "sleep")[1], json!({"level": 2}));
    assert_eq!(
        calls(&dir, "wake_up")[1..],
        [json!({"tags": ["weights"]}), json!({"tags": ["kv_cache"]})]
    );
    assert_eq!(calls(&dir, "collective_rpc"), [json!({"method": "reload_weights"})]);

    // vLLM has no context-only level.
    let message = unsupported(runtime.sleep(SleepLevel::Context).await);
    assert!(message.contains("weights_to_host"), "{message}");
    runtime.health().await.expect("the worker is fine");
    runtime.unload().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_model_without_sleep_mode_cannot_sleep() {
    let dir = scratch("vllm-no-sleep");
    let model = model("vllm", &dir, json!({ "vllm_enable_sleep_mode": false }));
    let runtime = load(BackendKind::Vllm, model, &dir).await;
    assert!(runtime.capabilities().sleep_levels.is_empty());
    let engine_args = calls(&dir, "AsyncEngineArgs");
    assert_eq!(engine_args.len(), 1);
    assert!(engine_args[0].get("enable_sleep_mode").is_none(), "{engine_args:?}");
    let message = unsupported(runtime.sleep(SleepLevel::WeightsToHost).await);
    assert!(message.contains("vllm_enable_sleep_mode"), "{message}");
    unsupported(runtime.wake().await);
    assert!(calls(&dir, "sleep").is_empty(), "vLLM was never asked");
    assert_eq!(answer(&runtime).await.unwrap(), ANSWER);
    runtime.unload().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_sleep_says_so() {
    let dir = scratch("exllamav3-no-sleep");
    let model = model("exllamav3", &dir, json!({}));
    let runtime = load(BackendKind::ExLlamaV3, model, &dir).await;
    assert!(runtime.capabilities().sleep_levels.is_empty());
    let message = unsupported(runtime.sleep(SleepLevel::WeightsDiscarded).await);
    assert!(message.contains("exllamav3 engine cannot sleep"), "{message}");
    unsupported(runtime.wake().await);
    runtime.health().await.expect("the worker is fine");
    runtime.unload().await;
    let _ = std::fs::remove_dir_all(&dir);
}
