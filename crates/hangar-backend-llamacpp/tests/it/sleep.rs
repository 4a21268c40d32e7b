//! Sleep and wake of the in-process engine: a sleeping replica drops its context (KV cache,
//! compute buffers) and keeps its weights, serves nothing, and after waking answers as
//! before. Memory is measured on the trained SmolLM2 (`cargo xtask fixtures`) in a child
//! process of this binary where the test runs alone, as `memory.rs` does; a plain `cargo
//! test` without the trained model skips that test loudly.

use std::sync::Arc;

use hangar_backend::{Runtime, RuntimeError, SleepLevel};
use hangar_backend_llamacpp::{LlamaCppBackend, LlamaCppRuntime};
use hangar_config::{ModelConfig, ModelName};
use serde_json::{Value, json};

use crate::support;

/// Set in the child process that measures: there the test runs alone.
const ALONE: &str = "HANGAR_LLAMACPP_SLEEP_TEST_ALONE";

/// A greedy completion of `prompt`, as text, or the engine's error.
async fn greedy(
    runtime: &dyn Runtime,
    prompt: &str,
    max_tokens: u32,
) -> Result<String, RuntimeError> {
    support::greedy(runtime, prompt, max_tokens).await.map(|(text, _)| text)
}

async fn load(model: Arc<ModelConfig>) -> Arc<LlamaCppRuntime> {
    let backend = LlamaCppBackend::new(support::llama());
    backend.load_replica(support::load_request(model, 0, 1)).await.expect("the model loads")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_replica_serves_nothing_and_wakes_with_the_same_greedy_answer() {
    let runtime = load(support::tiny(json!({ "target_inflight": 2 }))).await;
    assert_eq!(runtime.capabilities().sleep_levels, [SleepLevel::Context]);
    let before = greedy(&*runtime, "The weather today", 12).await.unwrap();
    assert_eq!(runtime.slots().await.unwrap().len(), 2, "two sequence slots awake");

    runtime.sleep(SleepLevel::Context).await.unwrap();
    runtime.sleep(SleepLevel::Context).await.expect("asleep already is fine");
    let refused = greedy(&*runtime, "The weather today", 12).await.unwrap_err();
    assert!(refused.to_string().contains("asleep"), "{refused}");
    assert!(runtime.slots().await.unwrap().is_empty(), "no context, no slots");
    runtime.health().await.expect("a sleeping replica is alive");

    runtime.wake().await.unwrap();
    runtime.wake().await.expect("awake already is fine");
    assert_eq!(greedy(&*runtime, "The weather today", 12).await.unwrap(), before);
    assert_eq!(runtime.slots().await.unwrap().len(), 2);

    // Only the context level: llama.cpp cannot move loaded weights to the host.
    for level in [SleepLevel::WeightsToHost, SleepLevel::WeightsDiscarded] {
        let refused = runtime.sleep(level).await.unwrap_err();
        assert!(matches!(refused, RuntimeError::Unsupported { .. }), "{refused:?}");
    }
    // A replica unloads asleep as well as awake.
    runtime.sleep(SleepLevel::Context).await.unwrap();
    runtime.unload().await;
    assert!(runtime.health().await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleep_asked_while_a_generation_runs_is_refused_and_the_generation_ends() {
    let runtime = load(support::tiny(json!({}))).await;
    let running = {
        let runtime = Arc::clone(&runtime);
        tokio::spawn(async move { greedy(&*runtime, "Once upon a time", 200).await })
    };
    // Wait until the generation holds its sequence.
    while !runtime.slots().await.unwrap().iter().any(|s| s.busy) {
        tokio::task::yield_now().await;
    }
    let refused = runtime.sleep(SleepLevel::Context).await.unwrap_err();
    assert!(refused.to_string().contains("in flight"), "{refused}");
    assert!(!running.await.unwrap().unwrap().is_empty(), "the generation finished");
    runtime.unload().await;
}

#[test]
fn sleep_gives_the_context_memory_back_on_the_trained_model() {
    let Some(path) = support::trained("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let test = "sleep_gives_the_context_memory_back_on_the_trained_model";
    support::alone(ALONE, module_path!(), test, || context_memory_comes_back(path));
}

/// SmolLM2-135M: 30 layers, 3 KV heads of 64, an f16 cache: 23,040 bytes a token, so 4 ×
/// 4,096 tokens of context are 360 MiB of KV cache, far more than its 90 MiB of weights.
async fn context_memory_comes_back(path: String) {
    let value: Value = json!({
        "backend": "llama_cpp", "model_path": path, "gguf_n_ctx": 4096, "target_inflight": 4
    });
    let name = ModelName::new("chat").unwrap();
    let model = Arc::new(ModelConfig::parse(&name, &value).unwrap());
    let runtime = load(model).await;
    let prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n";
    let before = greedy(&*runtime, prompt, 24).await.unwrap();
    let kv = 23_040u64 * 4 * 4096;
    let awake = support::rss_bytes();
    runtime.sleep(SleepLevel::Context).await.unwrap();
    let asleep = support::rss_bytes();
    println!("RSS awake {} MiB, asleep {} MiB", awake >> 20, asleep >> 20);
    assert!(
        awake.saturating_sub(asleep) >= kv * 9 / 10,
        "sleep gave back {} MiB of a {} MiB KV cache",
        awake.saturating_sub(asleep) >> 20,
        kv >> 20
    );
    runtime.wake().await.unwrap();
    assert_eq!(greedy(&*runtime, prompt, 24).await.unwrap(), before, "the same greedy answer");
    runtime.unload().await;
}
