//! Prompt caches across a swap, on the trained SmolLM2 (`cargo xtask fixtures`): what a
//! replica's slots hold is saved when it unloads or sleeps; a returning conversation after
//! a new load (or a wake) gets the saved cache back, reports its tokens as cached and
//! answers as a fresh context does; a cache saved with other settings is never restored.

use std::path::Path;
use std::sync::Arc;

use hangar_backend::{GenerateSummary, LoadRequest, PromptCacheRoot, Runtime, SleepLevel};
use hangar_backend_llamacpp::{LlamaCppBackend, LlamaCppRuntime};
use hangar_config::{ModelConfig, ModelName};
use serde_json::json;

use crate::support;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A conversation of some 500 tokens, in the model's ChatML.
fn conversation() -> String {
    let story = "The lighthouse keeper wrote down the colour of the sea every morning, \
                 the ships that passed, and the birds that rested on the rail. ";
    format!(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{}\
         What did the keeper write down?<|im_end|>\n<|im_start|>assistant\n",
        story.repeat(18)
    )
}

/// The greedy answer to `prompt` and what the generation cost.
async fn turn(runtime: &dyn Runtime, prompt: &str) -> (String, GenerateSummary) {
    support::greedy(runtime, prompt, 16).await.expect("the generation runs")
}

/// A replica of the trained model with `settings`, saving under `root` (or nowhere).
async fn load(
    path: &str,
    settings: serde_json::Value,
    root: Option<&Path>,
) -> Arc<LlamaCppRuntime> {
    let mut value = json!({ "backend": "llama_cpp", "model_path": path, "target_inflight": 2 });
    for (k, v) in settings.as_object().unwrap() {
        value[k] = v.clone();
    }
    let model = Arc::new(ModelConfig::parse(&ModelName::new("chat").unwrap(), &value).unwrap());
    let request = LoadRequest {
        prompt_cache: root.map(|dir| PromptCacheRoot { dir: dir.to_owned(), max_bytes: 1 << 30 }),
        ..LoadRequest::new(model, 0, 1)
    };
    LlamaCppBackend::new(support::llama()).load_replica(request).await.expect("the model loads")
}

/// The saved caches' files under `root`.
fn files(root: &Path) -> Vec<std::path::PathBuf> {
    let Ok(models) = std::fs::read_dir(root) else { return Vec::new() };
    models
        .flat_map(|m| std::fs::read_dir(m.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_returning_conversation_gets_its_cache_back_after_an_unload_and_a_sleep() {
    let Some(path) = support::trained(MODEL) else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("prompt-cache");
    let prompt = conversation();

    // The reference: a fresh context that never saw the conversation.
    let fresh = load(&path, json!({}), None).await;
    let (expected, first) = turn(&*fresh, &prompt).await;
    fresh.unload().await;
    assert!(first.prompt_tokens > 300 && first.cached_tokens == 0, "{first:?}");

    let runtime = load(&path, json!({}), Some(&root)).await;
    assert_eq!(turn(&*runtime, &prompt).await.0, expected);
    // A short unrelated request after the long one takes the other slot and is too short to
    // save; it evicts nothing.
    turn(&*runtime, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").await;
    runtime.unload().await;
    let saved = files(&root);
    assert_eq!(saved.len(), 2, "one cache (header and payload): {saved:?}");
    for file in &saved {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(file).unwrap().mode() & 0o777, 0o600, "{}", file.display());
    }

    // After the swap: restored, reported as cached, the same greedy answer.
    let runtime = load(&path, json!({}), Some(&root)).await;
    let (answer, summary) = turn(&*runtime, &prompt).await;
    assert_eq!(answer, expected);
    assert!(summary.cached_tokens + 1 >= summary.prompt_tokens, "{summary:?}");

    // Across a sleep as well: the wake's new context restores what the sleep saved.
    runtime.sleep(SleepLevel::Context).await.unwrap();
    runtime.wake().await.unwrap();
    assert_eq!(runtime.slots().await.unwrap().iter().map(|s| s.cached_tokens).max(), Some(0));
    let (answer, summary) = turn(&*runtime, &prompt).await;
    assert_eq!(answer, expected);
    assert!(summary.cached_tokens + 1 >= summary.prompt_tokens, "{summary:?}");
    runtime.unload().await;

    // Other settings (a quantized KV cache): the saved cache is not restored.
    let other = load(&path, json!({ "gguf_type_k": "q8_0" }), Some(&root)).await;
    let (_, summary) = turn(&*other, &prompt).await;
    assert_eq!(summary.cached_tokens, 0, "{summary:?}");
    other.unload().await;
}

/// Issue 59: caches were keyed by the file's size, head and tail, so a GGUF of the same size,
/// head and tail got another file's cache. Keyed to the whole file now.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_is_restored_into_the_same_weights_only_not_a_file_that_differs_in_the_middle() {
    let Some(trained) = support::trained(MODEL) else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("prompt-cache");
    let path = dir.path().join("model.gguf");
    let original = std::fs::read(&trained).unwrap();
    // Replaced as weights are: written aside, renamed over the model's path.
    let place = |bytes: &[u8]| {
        let aside = dir.path().join("model.gguf.new");
        std::fs::write(&aside, bytes).unwrap();
        std::fs::rename(&aside, &path).unwrap();
    };
    place(&original);
    let path_str = path.to_str().unwrap();
    let prompt = conversation();
    let runtime = load(path_str, json!({}), Some(&root)).await;
    let (_, first) = turn(&*runtime, &prompt).await;
    runtime.unload().await;
    assert!(!files(&root).is_empty(), "a cache was saved");

    // One byte of the weights changed in the middle: same size, head and tail. Nothing of
    // the cache is restored.
    let mut changed = original.clone();
    changed[original.len() / 2] ^= 0x10;
    place(&changed);
    let other = load(path_str, json!({}), Some(&root)).await;
    let (_, summary) = turn(&*other, &prompt).await;
    assert_eq!(summary.cached_tokens, 0, "{summary:?}");
    other.unload().await;

    // The same weights again: all of it is.
    place(&original);
    let same = load(path_str, json!({}), Some(&root)).await;
    let (_, summary) = turn(&*same, &prompt).await;
    assert_eq!(summary.prompt_tokens, first.prompt_tokens);
    assert!(summary.cached_tokens + 1 >= summary.prompt_tokens, "{summary:?}");
    same.unload().await;
}
