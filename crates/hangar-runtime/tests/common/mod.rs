//! Shared helpers for the manager tests: configs, a manager on the stub backend, and a
//! request runner.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use hangar_backend::stub::StubBackend;
use hangar_backend::{GenerateRequest, Prompt, SamplingParams, ThinkingMode};
use hangar_config::{BackendKind, Config};
use hangar_runtime::{Backends, Manager, ManagerError};
use serde_json::Value;
use tokio::sync::mpsc;

pub fn config(value: Value) -> Config {
    Config::from_value(&value).unwrap_or_else(|e| panic!("bad test config: {e}"))
}

pub fn manager(value: Value) -> (Manager, Arc<StubBackend>) {
    let stub = Arc::new(StubBackend::new());
    let llama = Arc::new(StubBackend::with_kind(BackendKind::LlamaCpp));
    let backends = Backends::new().with(stub.clone()).with(llama);
    (Manager::new(&config(value), backends), stub)
}

pub fn request(text: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text(text.to_owned()),
        params: SamplingParams { max_tokens: Some(max_tokens), ..SamplingParams::default() },
        thinking: ThinkingMode::Default,
        translation: None,
        tools: None,
        format: None,
        resume: None,
    }
}

/// Runs a generation to the end and returns the text.
pub async fn generate(m: &Manager, model: &str, max_tokens: u32) -> Result<String, ManagerError> {
    let (tx, mut rx) = mpsc::channel(64);
    let collect = tokio::spawn(async move {
        let mut text = String::new();
        while let Some(hangar_backend::GenerateEvent::Text(t)) = rx.recv().await {
            text.push_str(&t);
        }
        text
    });
    m.generate(model, request("hello world", max_tokens), tx).await?;
    Ok(collect.await.unwrap())
}

/// Spawns a generation and returns its handle.
pub fn spawn_generate(
    m: &Manager,
    model: &str,
    max_tokens: u32,
) -> tokio::task::JoinHandle<Result<String, ManagerError>> {
    let (m, model) = (m.clone(), model.to_owned());
    tokio::spawn(async move { generate(&m, &model, max_tokens).await })
}

/// Lets spawned tasks run until they block (paused clock: advances virtual time by 1 ms).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

pub fn state(m: &Manager, name: &str) -> String {
    m.model(name).unwrap().runtime_state.to_string()
}

pub fn loaded(m: &Manager) -> Vec<String> {
    m.models().into_iter().filter(|s| s.is_loaded).map(|s| s.name().to_owned()).collect()
}

/// The stub engine's pretend GPU as NVML would show it: one 80 GiB GPU.
pub struct PretendGpu(pub Arc<hangar_backend::stub::StubGpu>);

impl hangar_runtime::GpuProbe for PretendGpu {
    fn read(&self) -> Result<Vec<hangar_runtime::GpuReading>, hangar_runtime::GpuUnavailable> {
        Ok(vec![hangar_runtime::GpuReading {
            index: 0,
            name: "pretend".into(),
            used_mib: self.0.used_mib(),
            total_mib: 81920,
            processes: Vec::new(),
        }])
    }
}
