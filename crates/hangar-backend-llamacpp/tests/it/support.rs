//! What the tests of this crate share: llama.cpp initialised once per process, with
//! its log lines routed into `tracing` as the composition root (`hangard`) does, so that a
//! failed load carries llama.cpp's own reason; and the tiny chat fixture as a model config.

use std::sync::{Arc, OnceLock};

use hangar_backend::LoadRequest;
use hangar_backend_llamacpp::llama_cpp_2::{self, LogOptions, llama_backend::LlamaBackend};
use hangar_config::{ModelConfig, ModelName};
use serde_json::{Value, json};

/// The process's llama.cpp backend, with the log hook installed.
pub(crate) fn llama() -> Arc<LlamaBackend> {
    static LLAMA: OnceLock<Arc<LlamaBackend>> = OnceLock::new();
    Arc::clone(LLAMA.get_or_init(|| {
        llama_cpp_2::send_logs_to_tracing(LogOptions::default());
        Arc::new(LlamaBackend::init().expect("llama.cpp initialises once per process"))
    }))
}

/// The path of a committed fixture model.
pub(crate) fn fixture(name: &str) -> String {
    format!("{}/../../fixtures/models/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `llama_cpp` model `tiny` on the tiny chat GGUF, with the fields of `extra` set.
pub(crate) fn tiny(extra: Value) -> Arc<ModelConfig> {
    let mut value = json!({ "backend": "llama_cpp", "model_path": fixture("tiny-llama.gguf") });
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    Arc::new(ModelConfig::parse(&ModelName::new("tiny").unwrap(), &value).expect("valid model"))
}

/// The load of replica `replica` of `replicas` of `model`.
pub(crate) fn load_request(model: Arc<ModelConfig>, replica: u32, replicas: u32) -> LoadRequest {
    LoadRequest::new(model, replica, replicas)
}

/// Resident set size in bytes (Linux), from `/proc/self/statm`.
pub(crate) fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap();
    pages * 4096
}

/// Runs `measure` alone, for tests that read this process's memory, which any other test
/// loading a model would move: the test `<module>::<test>` (`module` as `module_path!()`
/// gives it) runs again in a child process of this binary with `flag` set, alone, and there
/// `measure` runs on a runtime of its own.
pub(crate) fn alone<F: std::future::Future<Output = ()>>(
    flag: &str,
    module: &str,
    test: &str,
    measure: impl FnOnce() -> F,
) {
    if std::env::var_os(flag).is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        return runtime.block_on(measure());
    }
    // The test's name in the binary (the crate name `it` is not part of it).
    let module = module.split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::{test}");
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--test-threads=1", "--nocapture"])
        .env(flag, "1")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the measuring child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the child did not run {name}:\n{stdout}");
}

/// The trained chat model, or `None` after a loud message when `cargo xtask fixtures` has
/// not fetched it and `HANGAR_TRAINED_MODELS` is unset (under `cargo xtask test`, which
/// sets it, a missing file fails).
pub(crate) fn trained(file: &str) -> Option<String> {
    let set = std::env::var_os("HANGAR_TRAINED_MODELS");
    let workspace = format!("{}/../../target/models", env!("CARGO_MANIFEST_DIR"));
    let dir = set.clone().map_or_else(|| workspace.into(), std::path::PathBuf::from);
    match std::fs::canonicalize(dir.join(file)) {
        Ok(path) => Some(path.to_str().unwrap().to_owned()),
        Err(e) if set.is_some() => panic!("HANGAR_TRAINED_MODELS: no {file} ({e})"),
        Err(_) => {
            eprintln!("\n*** SKIPPED: no trained model {file}: run `cargo xtask fixtures` ***\n");
            None
        }
    }
}

/// A greedy completion of `prompt`: its text and what it cost, or the engine's error.
pub(crate) async fn greedy(
    runtime: &dyn hangar_backend::Runtime,
    prompt: &str,
    max_tokens: u32,
) -> Result<(String, hangar_backend::GenerateSummary), hangar_backend::RuntimeError> {
    use hangar_backend::{GenerateEvent, GenerateRequest, Prompt, SamplingParams};
    let request = GenerateRequest {
        params: SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ..Default::default()
        },
        ..GenerateRequest::new(Prompt::Text(prompt.to_owned()))
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let collect = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(event) = rx.recv().await {
            if let GenerateEvent::Text(piece) = event {
                text.push_str(&piece);
            }
        }
        text
    });
    let summary = runtime.generate(request, tx).await?;
    Ok((collect.await.unwrap(), summary))
}
