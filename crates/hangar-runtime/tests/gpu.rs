//! VRAM figures from GPU telemetry: a load's GPU memory delta becomes the model's
//! `observed_load_delta` estimate, per replica count; without a GPU, or for a model on the
//! CPU, the estimate stays what the files say (or unavailable).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use hangar_backend::stub::StubBackend;
use hangar_runtime::{
    Backends, GpuProbe, GpuReading, GpuUnavailable, LoadOptions, Manager, VramEstimateSource,
};
use serde_json::json;

/// A GPU whose used memory is each read's next scripted value (the last one repeats).
struct Readings(Mutex<VecDeque<u64>>);

impl Readings {
    fn new(used: &[u64]) -> Arc<Self> {
        Arc::new(Self(Mutex::new(used.iter().copied().collect())))
    }
}

impl GpuProbe for Readings {
    fn read(&self) -> Result<Vec<GpuReading>, GpuUnavailable> {
        let mut queue = self.0.lock().unwrap();
        let used = if queue.len() > 1 { queue.pop_front() } else { queue.front().copied() };
        let used = used.expect("a scripted reading");
        Ok(vec![GpuReading {
            index: 0,
            name: "scripted".into(),
            used_mib: used,
            total_mib: 81920,
            processes: Vec::new(),
        }])
    }
}

fn manager(device: &str) -> Manager {
    let config = hangar_config::Config::from_value(&json!({
        "models": { "m": { "backend": "stub", "device": device, "replica_max": 2 } }
    }))
    .unwrap();
    Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())))
}

fn replicas(n: u32) -> LoadOptions {
    LoadOptions { replicas: std::num::NonZeroU32::new(n), ..LoadOptions::default() }
}

#[tokio::test]
async fn a_loads_gpu_delta_is_the_estimate_for_its_replica_count() {
    let manager = manager("gpu");
    let row = manager.model("m").unwrap();
    assert_eq!(row.vram_estimate_source, VramEstimateSource::Unavailable, "no files, no load yet");

    // 1,000 MiB used before the load, 3,048 after: the load took 2,048.
    manager.set_gpu_probe(Readings::new(&[1000, 3048]));
    let row = manager.load("m", replicas(1)).await.unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_replica_count, row.vram_estimate_source),
        (Some(2048), 1, VramEstimateSource::ObservedLoadDelta)
    );
    manager.unload("m").await.unwrap();

    // Two replicas take 4,096; each count keeps its own figure.
    manager.set_gpu_probe(Readings::new(&[1000, 5096]));
    let row = manager.load("m", replicas(2)).await.unwrap();
    assert_eq!((row.vram_estimate_mib, row.vram_estimate_replica_count), (Some(4096), 2));
    manager.unload("m").await.unwrap();
    let row = manager.model("m").unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_replica_count),
        (Some(2048), 1),
        "unloaded, the configured count's own figure"
    );
}

#[tokio::test]
async fn a_failed_load_a_cpu_model_or_no_telemetry_measure_nothing() {
    // A failed load records nothing.
    let config = hangar_config::Config::from_value(&json!({
        "models": { "m": { "backend": "stub", "device": "gpu", "stub": { "fail_load": "oom" } } }
    }))
    .unwrap();
    let failing = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    failing.set_gpu_probe(Readings::new(&[1000, 9000]));
    assert!(failing.load("m", LoadOptions::default()).await.is_err());
    assert_eq!(failing.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);

    // A model on the CPU is not measured, whatever the GPU does meanwhile.
    let cpu = manager("cpu");
    cpu.set_gpu_probe(Readings::new(&[1000, 9000]));
    cpu.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(cpu.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);

    // No telemetry (the default probe): nothing measured, no error.
    let blind = manager("gpu");
    blind.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(blind.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);
}

#[tokio::test]
async fn a_figure_measured_under_one_load_override_is_not_reported_for_another() {
    let config = hangar_config::Config::from_value(&json!({
        "models": { "m": { "backend": "llama_cpp", "model_path": "/nonexistent/m.gguf" } }
    }))
    .unwrap();
    let backend = StubBackend::with_kind(hangar_config::BackendKind::LlamaCpp);
    let manager = Manager::new(&config, Backends::new().with(Arc::new(backend)));
    manager.set_gpu_probe(Readings::new(&[1000, 2000]));
    let row = manager.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_source),
        (Some(1000), VramEstimateSource::ObservedLoadDelta)
    );
    manager.unload("m").await.unwrap();

    // A larger context, loaded with no telemetry: its footprint is unknown, and the figure
    // of the default context must not stand in for it.
    manager.set_gpu_probe(Arc::new(Blind));
    let mut options = LoadOptions::default();
    options.overrides.insert("gguf_n_ctx".into(), json!(8192));
    let row = manager.load("m", options).await.unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_source),
        (None, VramEstimateSource::Unavailable)
    );
    manager.unload("m").await.unwrap();

    // Back on the configured context: its own figure again.
    manager.set_gpu_probe(Readings::new(&[1000, 2000]));
    let row = manager.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(row.vram_estimate_mib, Some(1000));
}

/// A probe with nothing to read.
struct Blind;

impl GpuProbe for Blind {
    fn read(&self) -> Result<Vec<GpuReading>, GpuUnavailable> {
        Err(GpuUnavailable { reason: "no driver".into() })
    }
}
