//! Shared helpers for the manager tests: configs, a manager on the stub backend, and a
//! request runner.

use std::sync::Arc;
use std::time::Duration;

use hangar_backend::{GenerateRequest, Prompt, SamplingParams, ThinkingMode};
use hangar_config::{BackendKind, Config};
use hangar_runtime::{Backends, Manager, ManagerError};
use hangar_stub::StubBackend;
use serde_json::Value;
use tokio::sync::mpsc;

pub(crate) fn config(value: Value) -> Config {
    Config::from_value(&value).unwrap_or_else(|e| panic!("bad test config: {e}"))
}

pub(crate) fn manager(value: Value) -> (Manager, Arc<StubBackend>) {
    let stub = Arc::new(StubBackend::new());
    let llama = Arc::new(StubBackend::with_kind(BackendKind::LlamaCpp));
    let backends = Backends::new().with(stub.clone()).with(llama);
    (Manager::new(&config(value), backends), stub)
}

pub(crate) fn request(text: &str, max_tokens: u32) -> GenerateRequest {
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
pub(crate) async fn generate(
    m: &Manager,
    model: &str,
    max_tokens: u32,
) -> Result<String, ManagerError> {
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
pub(crate) fn spawn_generate(
    m: &Manager,
    model: &str,
    max_tokens: u32,
) -> tokio::task::JoinHandle<Result<String, ManagerError>> {
    let (m, model) = (m.clone(), model.to_owned());
    tokio::spawn(async move { generate(&m, &model, max_tokens).await })
}

/// Spawns a load of `model` without options and returns its handle.
pub(crate) fn spawn_load(
    m: &Manager,
    model: &str,
) -> tokio::task::JoinHandle<Result<hangar_runtime::ModelSnapshot, ManagerError>> {
    let (m, model) = (m.clone(), model.to_owned());
    tokio::spawn(async move { m.load(&model, hangar_runtime::LoadOptions::default()).await })
}

/// Lets spawned tasks run until they block (paused clock: advances virtual time by 1 ms).
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

pub(crate) fn state(m: &Manager, name: &str) -> String {
    m.model(name).unwrap().runtime_state.to_string()
}

pub(crate) fn loaded(m: &Manager) -> Vec<String> {
    m.models().into_iter().filter(|s| s.is_loaded).map(|s| s.name().to_owned()).collect()
}

/// The stub engine's pretend GPU as NVML would show it: one 80 GiB GPU.
pub(crate) struct PretendGpu(pub(crate) Arc<hangar_stub::StubGpu>);

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

/// A manager for `value` whose stub engine takes each model's footprint on a pretend GPU
/// with `base_mib` in use by something else.
pub(crate) fn manager_on_gpu(
    value: Value,
    base_mib: u64,
) -> (Manager, Arc<StubBackend>, Arc<hangar_stub::StubGpu>) {
    let gpu = hangar_stub::StubGpu::new(base_mib);
    let stub = Arc::new(StubBackend::new().with_gpu(Arc::clone(&gpu)));
    let m = Manager::new(&config(value), Backends::new().with(stub.clone()));
    m.set_gpu_probe(Arc::new(PretendGpu(Arc::clone(&gpu))));
    (m, stub, gpu)
}

/// A sparse file of `mib` MiB in a fresh directory for the test `label` (a model file whose
/// size is the figure a model is admitted by before it is measured), and the directory.
pub(crate) fn sparse_file(label: &str, mib: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("hangar-{label}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("model.bin");
    std::fs::File::create(&file).unwrap().set_len(mib << 20).unwrap();
    (dir, file)
}

/// Polls `future` once; `true` when it finished.
pub(crate) async fn poll_once<F: std::future::Future>(future: &mut std::pin::Pin<Box<F>>) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}

/// The caller that hangs up: for every count `n` from 0, starts `op`, polls it `n` times
/// (letting spawned work run between polls), drops it, lets everything settle, and calls
/// `check` with `n`; stops after the count at which `op` finished by itself.
pub(crate) async fn hang_up_after_every_poll<F, Fut, C, CFut>(mut op: F, mut check: C)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future,
    C: FnMut(usize) -> CFut,
    CFut: std::future::Future<Output = ()>,
{
    for polls in 0.. {
        let mut future = Box::pin(op());
        let mut finished = false;
        for _ in 0..polls {
            if poll_once(&mut future).await {
                finished = true;
                break;
            }
            settle().await;
        }
        drop(future);
        tokio::time::sleep(Duration::from_secs(30)).await;
        check(polls).await;
        if finished {
            return;
        }
        assert!(polls < 10_000, "the operation never finished");
    }
}
