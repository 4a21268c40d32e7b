//! VRAM figures and admission by measured footprint, on the stub engine's pretend GPU
//! (`StubGpu`: each stub replica takes its model's footprint while loaded):
//!
//! - a load's GPU delta becomes the model's `observed_load_delta` estimate, per replica
//!   count and load override; a failed load, a CPU model or no telemetry measure nothing;
//! - measured figures persist in `state_dir` and come back after a restart, unless the
//!   model's definition changed;
//! - under a `vram_budget`, a load that does not fit evicts least recently used idle models
//!   (of any type), or is refused with `insufficient_vram` naming what is missing and who
//!   holds the memory, evicting nothing;
//! - after an unload, the next GPU load waits (at most `RELEASE_WAIT`) until the memory
//!   shows as released (paused time);
//! - a weight update's second copy is counted by the model's figure, and refused when
//!   nothing tells what it takes (never counted as zero).

use std::sync::Arc;
use std::time::Duration;

use hangar_lifecycle::ModelState;
use hangar_runtime::{
    Backends, GpuProbe, GpuReading, GpuUnavailable, LoadOptions, Manager, ManagerError,
    RELEASE_WAIT, VramEstimateSource, VramMethod, WeightUpdate,
};
use hangar_stub::{StubBackend, StubGpu};
use serde_json::{Value, json};

use crate::support::PretendGpu as Probe;

/// A probe with nothing to read.
struct Blind;

impl GpuProbe for Blind {
    fn read(&self) -> Result<Vec<GpuReading>, GpuUnavailable> {
        Err(GpuUnavailable { reason: "no driver".into() })
    }
}

/// A manager for `settings` whose stub engine (standing in for `kind`) takes memory on a
/// pretend GPU with 1,000 MiB in use by something else.
fn setup(settings: Value, kind: hangar_config::BackendKind) -> (Manager, Arc<StubGpu>) {
    let config = hangar_config::Config::from_value(&settings).unwrap();
    let gpu = StubGpu::new(1000);
    let backend = StubBackend::with_kind(kind).with_gpu(Arc::clone(&gpu));
    let manager = Manager::new(&config, Backends::new().with(Arc::new(backend)));
    manager.set_gpu_probe(Arc::new(Probe(Arc::clone(&gpu))));
    (manager, gpu)
}

fn stub(settings: Value) -> (Manager, Arc<StubGpu>) {
    setup(settings, hangar_config::BackendKind::Stub)
}

fn replicas(n: u32) -> LoadOptions {
    LoadOptions { replicas: std::num::NonZeroU32::new(n), ..LoadOptions::default() }
}

#[tokio::test]
async fn a_loads_gpu_delta_is_the_estimate_for_its_replica_count() {
    let (manager, gpu) = stub(json!({
        "models": { "m": { "backend": "stub", "device": "gpu", "replica_max": 2 } }
    }));
    gpu.set_footprint("m", 2048);
    let row = manager.model("m").unwrap();
    assert_eq!(row.vram_estimate_source, VramEstimateSource::Unavailable, "no files, no load yet");
    assert_eq!(row.vram_detail, None);

    let row = manager.load("m", replicas(1)).await.unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_replica_count, row.vram_estimate_source),
        (Some(2048), 1, VramEstimateSource::ObservedLoadDelta)
    );
    let detail = row.vram_detail.unwrap();
    assert_eq!(
        (detail.admission_mib, detail.admission_method),
        (2048, VramMethod::ObservedLoadDelta)
    );
    assert_eq!(detail.process_tree, None, "an in-process engine has no process tree");
    manager.unload("m").await.unwrap();

    // Two replicas take 4,096; each count keeps its own figure.
    let row = manager.load("m", replicas(2)).await.unwrap();
    assert_eq!((row.vram_estimate_mib, row.vram_estimate_replica_count), (Some(4096), 2));
    manager.unload("m").await.unwrap();
    let row = manager.model("m").unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_replica_count),
        (Some(2048), 1),
        "unloaded, the configured count's own figure"
    );

    // A reload is measured too: the new runtimes' memory while the old ones still serve.
    manager.load("m", replicas(1)).await.unwrap();
    gpu.set_footprint("m", 3000);
    let row = manager.reload("m", replicas(1)).await.unwrap();
    assert_eq!(row.vram_estimate_mib, Some(3000), "{row:?}");
}

#[tokio::test]
async fn a_failed_load_a_cpu_model_or_no_telemetry_measure_nothing() {
    let (failing, gpu) = stub(json!({
        "models": { "m": { "backend": "stub", "device": "gpu", "stub": { "fail_load": "oom" } } }
    }));
    gpu.set_footprint("m", 9000);
    assert!(failing.load("m", LoadOptions::default()).await.is_err());
    assert_eq!(failing.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);

    // A model on the CPU is not measured, whatever the GPU does meanwhile.
    let (cpu, gpu) = stub(json!({ "models": { "m": { "backend": "stub", "device": "cpu" } } }));
    gpu.set_footprint("m", 9000);
    let row = cpu.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(
        (row.vram_estimate_source, row.vram_detail),
        (VramEstimateSource::Unavailable, None)
    );

    // No telemetry: nothing measured, no error.
    let (blind, _) = stub(json!({ "models": { "m": { "backend": "stub", "device": "gpu" } } }));
    blind.set_gpu_probe(Arc::new(Blind));
    blind.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(blind.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);
}

#[tokio::test]
async fn a_figure_measured_under_one_load_override_is_not_reported_for_another() {
    let settings = json!({
        "models": { "m": { "backend": "llama_cpp", "model_path": "/nonexistent/m.gguf" } }
    });
    let (manager, gpu) = setup(settings, hangar_config::BackendKind::LlamaCpp);
    gpu.set_footprint("m", 1000);
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
    manager.set_gpu_probe(Arc::new(Probe(gpu)));
    let row = manager.load("m", LoadOptions::default()).await.unwrap();
    assert_eq!(row.vram_estimate_mib, Some(1000));
}

/// A fresh state directory.
fn state_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hangar-state-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test]
async fn measured_figures_survive_a_restart_unless_the_definition_changed() {
    let dir = state_dir("restart");
    let settings = |ctx: u32| {
        json!({
            "state_dir": dir,
            "models": {
                "m": { "backend": "llama_cpp", "model_path": "/nonexistent/m.gguf", "gguf_n_ctx": ctx },
                "other": { "backend": "llama_cpp", "model_path": "/nonexistent/o.gguf" }
            }
        })
    };
    let kind = hangar_config::BackendKind::LlamaCpp;
    {
        let (manager, gpu) = setup(settings(4096), kind);
        gpu.set_footprint("m", 3333);
        manager.load("m", LoadOptions::default()).await.unwrap();
        let saved: Value = serde_json::from_slice(
            &std::fs::read(dir.join(hangar_runtime::VRAM_STATE_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(saved["models"]["m"]["figures"][0]["mib"], 3333, "{saved:#}");
        assert_eq!(saved["models"].get("other"), None, "nothing measured, nothing saved");
    }
    // The next start knows the figure before any load, with no telemetry at all.
    let (restarted, _) = setup(settings(4096), kind);
    restarted.set_gpu_probe(Arc::new(Blind));
    let row = restarted.model("m").unwrap();
    assert_eq!(
        (row.vram_estimate_mib, row.vram_estimate_source),
        (Some(3333), VramEstimateSource::ObservedLoadDelta)
    );
    // Another context is another model as far as memory goes: the figure is dropped.
    let (changed, _) = setup(settings(8192), kind);
    assert_eq!(changed.model("m").unwrap().vram_estimate_source, VramEstimateSource::Unavailable);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three GPU models and an embedding model under a 6,000 MiB budget (1,000 MiB used by
/// something else), with measured footprints.
fn budgeted(budget: Value) -> (Manager, Arc<StubGpu>) {
    let gpu_model = |ty: &str| json!({ "backend": "stub", "device": "gpu", "labels": [ty] });
    let (manager, gpu) = stub(json!({
        "max_loaded_models": { "llm": 4, "embedding": 4 },
        "vram_budget": budget,
        "models": {
            "a": gpu_model("llm"), "b": gpu_model("llm"), "big": gpu_model("llm"),
            "emb": gpu_model("embedding"),
            "pinned": { "backend": "stub", "device": "gpu", "pinned": true }
        }
    }));
    for (model, mib) in [("a", 2000), ("b", 2000), ("emb", 1000), ("big", 4500), ("pinned", 3000)] {
        gpu.set_footprint(model, mib);
    }
    (manager, gpu)
}

async fn measure(manager: &Manager, models: &[&str]) {
    for m in models {
        manager.load(m, LoadOptions::default()).await.unwrap();
        manager.unload(m).await.unwrap();
    }
}

fn state(manager: &Manager, name: &str) -> ModelState {
    manager.model(name).unwrap().runtime_state
}

#[tokio::test]
async fn a_load_that_does_not_fit_evicts_lru_idle_models_of_any_type_until_it_does() {
    let (manager, _gpu) = budgeted(json!(6000));
    measure(&manager, &["a", "b", "emb", "big"]).await;
    // 1,000 + a 2,000 + emb 1,000 + b 2,000 = 6,000: the budget is full.
    for m in ["a", "emb", "b"] {
        manager.load(m, LoadOptions::default()).await.unwrap();
    }
    // big needs 4,500: a (2,000, least recent) and emb (1,000) are not enough, b goes too.
    let row = manager.load("big", LoadOptions::default()).await.unwrap();
    assert_eq!(row.vram_detail.unwrap().admission_mib, 4500);
    for (m, s) in
        [("a", ModelState::Unloaded), ("emb", ModelState::Unloaded), ("b", ModelState::Unloaded)]
    {
        assert_eq!(state(&manager, m), s, "{m}");
    }
    let evicted: Vec<String> = manager
        .follow_events(Some((manager.events_epoch(), 0)))
        .backlog
        .into_iter()
        .filter_map(|e| match e.kind {
            hangar_runtime::EventKind::Evicted { reason, for_model } if for_model == "big" => {
                Some(format!("{}:{reason}", e.model))
            }
            _ => None,
        })
        .collect();
    assert_eq!(evicted, ["a:vram_budget", "emb:vram_budget", "b:vram_budget"]);

    // With room, nothing is evicted: 1,000 + a 2,000 + emb 1,000 fit in 6,000.
    manager.unload("big").await.unwrap();
    manager.load("a", LoadOptions::default()).await.unwrap();
    manager.load("emb", LoadOptions::default()).await.unwrap();
    assert_eq!(state(&manager, "a"), ModelState::Loaded);
}

#[tokio::test]
async fn a_load_that_cannot_fit_is_refused_with_what_is_missing_and_evicts_nothing() {
    let (manager, _gpu) = budgeted(json!({ "0": "7.5%" })); // 7.5% of 81,920 = 6,144 MiB
    measure(&manager, &["a", "big", "pinned"]).await;
    manager.load("pinned", LoadOptions::default()).await.unwrap();
    manager.load("a", LoadOptions::default()).await.unwrap();
    // Used 1,000 + 3,000 + 2,000 = 6,000 of 6,144: 144 free. big needs 4,500; evicting
    // a frees 2,000; pinned stays: 2,356 missing.
    let err = manager.load("big", LoadOptions::default()).await.unwrap_err();
    let ManagerError::InsufficientVram { model, shortfall } = &err else { panic!("{err:?}") };
    assert_eq!(model, "big");
    assert_eq!(
        (shortfall.needed_mib, shortfall.free_mib, shortfall.missing_mib),
        (4500, 144, 2356)
    );
    let holders: Vec<_> =
        shortfall.holders.iter().map(|(n, mib, held)| (n.as_str(), *mib, *held)).collect();
    assert_eq!(holders, [("pinned", 3000, true), ("a", 2000, false)]);
    assert_eq!(err.code().as_str(), "insufficient_vram");
    assert_eq!(state(&manager, "a"), ModelState::Loaded, "nothing evicted");
    let big = manager.model("big").unwrap();
    assert!(big.failures.is_empty(), "a refusal is not the model's failure: {:?}", big.failures);
    assert!(big.last_error.unwrap().starts_with("insufficient_vram"));

    // Once the pinned model is unloaded by hand, the same load evicts a and fits.
    manager.unload("pinned").await.unwrap();
    manager.load("big", LoadOptions::default()).await.unwrap();
    assert_eq!(state(&manager, "a"), ModelState::Unloaded);
}

/// GPU models `a` (5,000 MiB), `b` (700 MiB) and a CPU model; `a` was loaded and unloaded,
/// and the pretend driver has not yet shown its memory as free.
async fn after_a_lagging_release() -> (Manager, Arc<StubGpu>) {
    let (manager, gpu) = stub(json!({
        "models": {
            "a": { "backend": "stub", "device": "gpu" },
            "b": { "backend": "stub", "device": "gpu" },
            "cpu": { "backend": "stub", "device": "cpu" }
        }
    }));
    gpu.set_footprint("a", 5000);
    gpu.set_footprint("b", 700);
    manager.load("a", LoadOptions::default()).await.unwrap();
    gpu.lag_releases(true);
    manager.unload("a").await.unwrap();
    assert_eq!(gpu.used_mib(), 6000, "the driver still shows a's memory");
    (manager, gpu)
}

#[tokio::test(start_paused = true)]
async fn a_load_after_an_unload_waits_until_the_memory_shows_as_released() {
    let (manager, gpu) = after_a_lagging_release().await;

    let load = tokio::spawn({
        let manager = manager.clone();
        async move { manager.load("b", LoadOptions::default()).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(state(&manager, "b"), ModelState::Loading, "waits for the release");
    assert!(!load.is_finished());

    gpu.release_now();
    let row = load.await.unwrap().unwrap();
    assert_eq!(row.runtime_state, ModelState::Loaded);
    // Measured from before the release, b's delta would be 1,700 - 6,000: nothing.
    assert_eq!(row.vram_estimate_mib, Some(700), "b measured from after the release");
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_a_release_is_bounded() {
    let (manager, _gpu) = after_a_lagging_release().await;

    // A CPU model does not wait for GPU memory.
    let start = tokio::time::Instant::now();
    manager.load("cpu", LoadOptions::default()).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(1));

    // The memory never shows as released: the load goes ahead once the wait ran out.
    let start = tokio::time::Instant::now();
    let row = manager.load("b", LoadOptions::default()).await.unwrap();
    let waited = start.elapsed();
    // a's release may land any time now: b's GPU delta would be wrong, so none is kept.
    assert_eq!(row.vram_estimate_source, VramEstimateSource::Unavailable, "{row:?}");
    assert!(waited >= RELEASE_WAIT - Duration::from_secs(1), "waited {waited:?}");
    assert!(waited <= RELEASE_WAIT + Duration::from_secs(1), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_second_copy_is_refused_while_nothing_tells_its_memory_and_counted_once_measured() {
    let (manager, gpu) = stub(json!({
        "vram_budget": 8000,
        "models": {
            "a": { "backend": "stub", "device": "gpu" },
            "b": { "backend": "stub", "device": "gpu" }
        }
    }));
    gpu.set_footprint("a", 5000);
    gpu.set_footprint("b", 3000);
    manager.load("a", LoadOptions::default()).await.unwrap();
    gpu.lag_releases(true);
    manager.unload("a").await.unwrap();
    // a's memory never shows as released while b loads: b's delta would be wrong, so b has
    // no figure (and a stub has no file to estimate from).
    let row = manager.load("b", LoadOptions::default()).await.unwrap();
    assert_eq!(row.vram_estimate_source, VramEstimateSource::Unavailable, "{row:?}");
    gpu.lag_releases(false);
    gpu.release_now();
    assert_eq!(gpu.used_mib(), 4000);

    // Counted as zero, b's second copy would fit in the 4,000 MiB free; nothing says so.
    let err = manager.update_weights_from_disk("b", WeightUpdate::default()).await.unwrap_err();
    assert!(matches!(err, ManagerError::MemoryNotKnown { gpu: true, .. }), "{err:?}");
    assert_eq!(err.code().as_str(), "insufficient_vram");
    assert!(err.to_string().contains("unload the model and load it again"), "{err}");
    assert_eq!(state(&manager, "b"), ModelState::Loaded, "the old weights keep serving");
    assert_eq!(gpu.used_mib(), 4000, "no second copy was made");

    // Loaded again, b is measured: its second copy is counted (1,000 + 2 × 3,000 fit).
    manager.unload("b").await.unwrap();
    manager.load("b", LoadOptions::default()).await.unwrap();
    manager.update_weights_from_disk("b", WeightUpdate::default()).await.unwrap();
    // At 3,600 MiB a copy, 1,000 + 2 × 3,600 is past the budget: refused by the figure.
    gpu.set_footprint("b", 3600);
    manager.unload("b").await.unwrap();
    manager.load("b", LoadOptions::default()).await.unwrap();
    let err = manager.update_weights_from_disk("b", WeightUpdate::default()).await.unwrap_err();
    let ManagerError::InsufficientVram { shortfall, .. } = &err else { panic!("{err:?}") };
    let figures = (shortfall.needed_mib, shortfall.free_mib, shortfall.missing_mib);
    assert_eq!(figures, (3600, 3400, 200), "{shortfall:?}");
}

#[tokio::test]
async fn a_reload_under_an_override_never_measured_is_counted_as_the_running_copy() {
    let settings = json!({
        "vram_budget": 6500,
        "models": { "m": { "backend": "llama_cpp", "model_path": "/nonexistent/m.gguf" } }
    });
    let (manager, gpu) = setup(settings, hangar_config::BackendKind::LlamaCpp);
    gpu.set_footprint("m", 3000);
    manager.load("m", LoadOptions::default()).await.unwrap();
    // Nothing was measured at 8,192 tokens and there is no file to estimate from: the
    // running copy's 3,000 MiB stand in, and 1,000 + 3,000 + 3,000 is past 6,500.
    let mut options = LoadOptions::default();
    options.overrides.insert("gguf_n_ctx".into(), json!(8192));
    let err = manager.reload("m", options).await.unwrap_err();
    let ManagerError::InsufficientVram { shortfall, .. } = &err else { panic!("{err:?}") };
    assert_eq!((shortfall.needed_mib, shortfall.missing_mib), (3000, 500), "{shortfall:?}");
    assert_eq!(gpu.used_mib(), 4000, "no second copy was made");
}

#[tokio::test]
async fn a_gguf_model_is_estimated_from_its_header_before_it_is_measured() {
    // tiny-llama (xtask/src/fixtures.rs): 2 layers, 1 KV head of 32 (keys and values),
    // trained context 2048.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf");
    let weights_mib = std::fs::metadata(path).unwrap().len().div_ceil(1 << 20);
    let (manager, gpu) = setup(
        json!({ "models": {
            "m": { "backend": "llama_cpp", "model_path": path, "device": "gpu", "replica_max": 2 },
            "cpu": { "backend": "llama_cpp", "model_path": path, "device": "cpu" }
        } }),
        hangar_config::BackendKind::LlamaCpp,
    );
    let row = manager.model("m").unwrap();
    let detail = row.vram_detail.unwrap();
    let gguf = detail.gguf_estimate.clone().unwrap();
    // f16 K and V: 2 layers × 2048 tokens × (32 + 32) × 2 bytes = 512 KiB, a whole MiB.
    assert_eq!(
        (gguf.n_ctx, gguf.type_k.as_str(), gguf.layers, gguf.kv_cache_mib),
        (2048, "f16", 2, 1)
    );
    assert_eq!((gguf.weights_mib, gguf.mib), (weights_mib, weights_mib + 1));
    assert_eq!(
        (detail.admission_method, detail.admission_mib),
        (VramMethod::GgufEstimate, gguf.mib)
    );
    assert_eq!(row.vram_estimate_source, VramEstimateSource::ModelArtifactSize, "the spec's field");
    assert_eq!(manager.model("cpu").unwrap().vram_detail, None, "not on a GPU");

    // A load override of the context and cache types is estimated as it would load: 64Ki
    // tokens of q8_0 (34 bytes a block of 32) = 2 × 65536 × 2 × 32 × 34 / 32 bytes.
    let mut options = replicas(2);
    options.overrides.insert("gguf_n_ctx".into(), json!(65536));
    options.overrides.insert("gguf_type_k".into(), json!("q8_0"));
    options.overrides.insert("gguf_type_v".into(), json!("q8_0"));
    options.overrides.insert("gguf_flash_attn".into(), json!("on"));
    gpu.set_footprint("m", 77);
    let row = manager.load("m", options).await.unwrap();
    let gguf = row.vram_detail.as_ref().unwrap().gguf_estimate.clone().unwrap();
    let kv = (2u64 * 65536 * 2 * 32 * 34 / 32).div_ceil(1 << 20);
    assert_eq!((gguf.n_ctx, gguf.type_v.as_str(), gguf.kv_cache_mib), (65536, "q8_0", kv));
    assert_eq!((gguf.replica_count, gguf.mib), (2, 2 * (weights_mib + kv)));
    // Once measured, the measurement wins.
    let detail = row.vram_detail.unwrap();
    assert_eq!(
        (detail.admission_method, detail.admission_mib),
        (VramMethod::ObservedLoadDelta, 154)
    );
}
