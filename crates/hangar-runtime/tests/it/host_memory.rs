//! Host memory as a place (`ram_budget`): models on the CPU are admitted against it by
//! their files' size (sparse files here) until measured, evict least recently used idle CPU
//! models for room, are refused before anything is evicted when nothing could make room,
//! and a file that a loaded model maps already counts once. A GPU model counts with its
//! host part: the layers `n_gpu_layers` leaves on the CPU.

use std::path::Path;

use hangar_runtime::{HostMethod, LoadOptions, Manager, ManagerError, ModelState};
use serde_json::{Value, json};

use crate::support::manager;

const MIB: u64 = 1 << 20;

/// A stub model on the CPU whose file is `mib` MiB (sparse), at `dir/<file>`.
fn cpu(dir: &Path, file: &str, mib: u64) -> Value {
    let path = dir.join(file);
    if !path.exists() {
        std::fs::File::create(&path).unwrap().set_len(mib * MIB).unwrap();
    }
    json!({ "backend": "stub", "device": "cpu", "model_path": path })
}

fn state(m: &Manager, name: &str) -> ModelState {
    m.model(name).unwrap().runtime_state
}

async fn load(m: &Manager, name: &str) -> Result<hangar_runtime::ModelSnapshot, ManagerError> {
    m.load(name, LoadOptions::default()).await
}

#[tokio::test]
async fn cpu_models_are_admitted_against_the_host_memory_budget() {
    let dir = std::env::temp_dir().join(format!("hangar-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, _) = manager(json!({
        "ram_budget": 3000,
        "max_loaded_models": { "llm": 8 },
        "models": {
            "a": cpu(&dir, "a.gguf", 1200), "b": cpu(&dir, "b.gguf", 1200),
            "c": cpu(&dir, "c.gguf", 1500), "big": cpu(&dir, "big.gguf", 4000),
            // The same file as c: its pages are c's.
            "c-twin": cpu(&dir, "c.gguf", 1500),
            // On a GPU: not the host's memory.
            "gpu": { "backend": "stub", "device": "gpu", "model_path": dir.join("big.gguf") }
        }
    }));
    let before = m.model("a").unwrap().host_memory.expect("a CPU model's figure");
    assert_eq!((before.mib, before.method), (1200, HostMethod::ModelArtifactSize));
    assert_eq!(m.model("gpu").unwrap().host_memory, None);

    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    // c (1,500) beside a and b (2,400 of 3,000): a, the least recently used, makes room.
    load(&m, "c").await.unwrap();
    assert_eq!((state(&m, "a"), state(&m, "b")), (ModelState::Unloaded, ModelState::Loaded));

    // 4,000 MiB fits no 3,000 MiB budget: refused, nothing evicted.
    let refused = load(&m, "big").await.unwrap_err();
    let ManagerError::InsufficientMemory { shortfall, .. } = &refused else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (shortfall.needed_mib, shortfall.free_mib, shortfall.missing_mib),
        (4000, 300, 1000)
    );
    let holders: Vec<(&str, u64)> =
        shortfall.holders.iter().map(|(n, mib, _)| (n.as_str(), *mib)).collect();
    assert_eq!(holders, [("c", 1500), ("b", 1200)]);
    assert_eq!(refused.code().as_str(), "insufficient_memory");
    assert_eq!((state(&m, "b"), state(&m, "c")), (ModelState::Loaded, ModelState::Loaded));

    // c's twin maps c's file: it needs nothing more and evicts nobody.
    load(&m, "c-twin").await.unwrap();
    for model in ["b", "c", "c-twin"] {
        assert_eq!(state(&m, model), ModelState::Loaded, "{model}");
    }
    // A GPU model whose host part the files do not tell (a stub's) loads by slots only.
    load(&m, "gpu").await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn without_a_ram_budget_cpu_models_load_by_slots_only() {
    let dir = std::env::temp_dir().join(format!("hangar-host-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each file (sparse) is 1 TiB, more than any machine's memory: admission by host
    // memory, even against all of it, would refuse them.
    let tib = 1 << 20;
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 8 },
        "models": { "a": cpu(&dir, "a.gguf", tib), "b": cpu(&dir, "b.gguf", tib) }
    }));
    assert_eq!(m.model("a").unwrap().host_memory.map(|f| f.mib), Some(tib), "the figure is known");
    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    assert_eq!((state(&m, "a"), state(&m, "b")), (ModelState::Loaded, ModelState::Loaded));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A llama.cpp model (the stub standing in) on `device`, whose file is the tiny GGUF's
/// header and weights grown (sparse) to `mib` MiB: 2 layers, and 1 MiB of KV cache at its
/// trained context.
fn gguf(dir: &Path, file: &str, mib: u64, device: &str, gpu_layers: Option<i32>) -> Value {
    let path = dir.join(file);
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf");
    std::fs::copy(tiny, &path).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(mib * MIB).unwrap();
    let mut model = json!({ "backend": "llama_cpp", "device": device, "model_path": path });
    if let Some(layers) = gpu_layers {
        model["gguf_n_gpu_layers"] = json!(layers);
    }
    model
}

#[tokio::test]
async fn a_gpu_models_host_part_counts_against_the_host_memory_budget() {
    let dir = std::env::temp_dir().join(format!("hangar-host-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, _) = manager(json!({
        "ram_budget": 3000,
        "max_loaded_models": { "llm": 8 },
        "models": {
            // 1,200 MiB of weights and 1 of KV cache on the CPU.
            "cpu": gguf(&dir, "cpu.gguf", 1200, "cpu", None),
            "cpu2": gguf(&dir, "cpu2.gguf", 1200, "cpu", None),
            // One of two layers on the GPU: half of 2,401 MiB stays on the host.
            "half": gguf(&dir, "half.gguf", 2400, "gpu", Some(1)),
            "huge": gguf(&dir, "huge.gguf", 8000, "gpu", Some(1)),
            // Every layer on the GPU (unset, or -1): nothing known on the host.
            "full": gguf(&dir, "full.gguf", 8000, "gpu", None),
            "all": gguf(&dir, "all.gguf", 8000, "gpu", Some(-1)),
        }
    }));
    let host = |name: &str| m.model(name).unwrap().host_memory.map(|f| (f.mib, f.method));
    assert_eq!(host("cpu"), Some((1201, HostMethod::GgufEstimate)));
    assert_eq!(host("half"), Some((1201, HostMethod::GgufEstimate)));
    assert_eq!((host("full"), host("all")), (None, None));

    load(&m, "half").await.unwrap();
    load(&m, "cpu").await.unwrap();
    // cpu2 needs 1,201 with 598 left: half, the least recently used, goes for it.
    load(&m, "cpu2").await.unwrap();
    assert_eq!(state(&m, "half"), ModelState::Unloaded, "evicted for host memory");
    assert_eq!(state(&m, "cpu"), ModelState::Loaded);

    // 4,001 MiB on the host fits no 3,000 MiB budget: refused, nothing evicted.
    let refused = load(&m, "huge").await.unwrap_err();
    let ManagerError::InsufficientMemory { shortfall, .. } = &refused else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (shortfall.needed_mib, shortfall.free_mib, shortfall.missing_mib),
        (4001, 598, 1001)
    );
    // Fully offloaded models need no host room: both CPU models stay.
    load(&m, "full").await.unwrap();
    load(&m, "all").await.unwrap();
    for model in ["cpu", "cpu2", "full", "all"] {
        assert_eq!(state(&m, model), ModelState::Loaded, "{model}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
