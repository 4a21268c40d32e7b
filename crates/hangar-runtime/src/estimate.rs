//! VRAM figures derived before any load: the size of a model's files, and for GGUF models
//! the weights plus the KV cache the configured context and cache types take; and the
//! check that a GGUF model's file is one, before an engine is asked to load it.

use std::path::Path;

use hangar_config::{BackendSettings, ModelConfig};
use hangar_weights::GgufShape;
use serde::{Deserialize, Serialize};

/// What a model's files say, read once when the manager is built.
#[derive(Debug, Clone, Default)]
pub(crate) struct Artifacts {
    /// The model's files (the model, a `llama-server` model's mmproj and draft) in MiB.
    pub(crate) mib: Option<u64>,
    /// The GGUF header's attention shape, for models llama.cpp runs.
    pub(crate) gguf: Option<GgufShape>,
    /// The model file engines map (`model_path`, canonical, when it is a file) and its size
    /// in MiB: loaded models on one file share its pages (`host.rs`).
    pub(crate) mapped: Option<(std::path::PathBuf, u64)>,
}

impl Artifacts {
    pub(crate) fn read(config: &ModelConfig) -> Self {
        let mut paths: Vec<&str> = config.model_path.as_deref().into_iter().collect();
        if let BackendSettings::LlamaServer(s) = &config.settings {
            paths.extend(s.llama_server_mmproj.as_deref());
            paths.extend(s.llama_server_draft_model.as_deref());
        }
        let sizes: Vec<u64> = paths.iter().filter_map(|p| size(Path::new(p), 0)).collect();
        let bytes: u64 = sizes.iter().sum();
        let llama = matches!(
            config.settings,
            BackendSettings::LlamaCpp(_) | BackendSettings::LlamaServer(_)
        );
        let gguf = config
            .model_path
            .as_deref()
            .filter(|_| llama)
            .and_then(|p| hangar_weights::gguf_shape(Path::new(p)).ok());
        let mapped = config.model_path.as_deref().and_then(|p| {
            let file = std::fs::canonicalize(p).ok()?;
            let meta = std::fs::metadata(&file).ok().filter(std::fs::Metadata::is_file)?;
            Some((file, meta.len().div_ceil(1 << 20)))
        });
        Self { mib: (bytes > 0).then(|| bytes.div_ceil(1 << 20)), gguf, mapped }
    }
}

/// Checks, before any engine runs, that the file a llama.cpp model (`llama_cpp`,
/// `llama_server`) loads is a GGUF whose tensors lie inside it: a file that is not is
/// Hangar's refusal ([`LoadError::Refused`], which evicts nothing), not an engine's failure
/// that evicting other models might cure. A missing file is left to the engine's own
/// not-found; the header is read on a blocking thread.
pub(crate) async fn check_weights(model: &ModelConfig) -> Result<(), hangar_backend::LoadError> {
    let llama =
        matches!(model.settings, BackendSettings::LlamaCpp(_) | BackendSettings::LlamaServer(_));
    let Some(path) = model.model_path.clone().filter(|_| llama) else { return Ok(()) };
    let checked = tokio::task::spawn_blocking(move || {
        if !Path::new(&path).is_file() {
            return Ok(());
        }
        hangar_weights::locate_tensors(Path::new(&path)).map(drop).map_err(|e| {
            let message = format!("model_path `{path}` is not a GGUF file llama.cpp can load: {e}");
            hangar_backend::LoadError::Refused { message }
        })
    });
    checked.await.unwrap_or(Ok(()))
}

/// Total size of a file, or of the files in a directory (recursively), in bytes.
fn size(path: &Path, depth: u32) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return Some(meta.len());
    }
    if !meta.is_dir() || depth > 4 {
        return None;
    }
    let entries = std::fs::read_dir(path).ok()?.filter_map(Result::ok);
    Some(entries.filter_map(|e| size(&e.path(), depth + 1)).sum())
}

/// A GGUF model's VRAM before it is loaded: its files plus the KV cache for the context and
/// cache types it would load with, per replica. An upper bound for sliding-window models;
/// compute buffers are not counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgufEstimate {
    /// Weights plus KV cache for `replica_count` replicas, in MiB.
    pub mib: u64,
    /// The replicas the figure is for.
    pub replica_count: u32,
    /// The model's files (model, mmproj, draft) per replica, in MiB.
    pub weights_mib: u64,
    /// One replica's KV cache, in MiB.
    pub kv_cache_mib: u64,
    /// The context the cache is sized for, in tokens.
    pub n_ctx: u64,
    /// The K cache type.
    pub type_k: String,
    /// The V cache type.
    pub type_v: String,
    /// Layers, from the header.
    pub layers: u32,
}

/// The GGUF estimate of `model` (the effective definition, overrides applied) for
/// `replicas` replicas; `None` without a GGUF shape or file size.
pub(crate) fn gguf_estimate(
    artifacts: &Artifacts,
    model: &ModelConfig,
    replicas: u32,
) -> Option<GgufEstimate> {
    let shape = artifacts.gguf.as_ref()?;
    let weights_mib = artifacts.mib?;
    let (n_ctx, type_k, type_v) = match &model.settings {
        BackendSettings::LlamaCpp(s) => (
            s.gguf_n_ctx.map(u64::from),
            s.gguf_type_k.map(|t| t.as_str().to_owned()),
            s.gguf_type_v.map(|t| t.as_str().to_owned()),
        ),
        BackendSettings::LlamaServer(s) => {
            let args = s.llama_server_extra_args.as_deref().unwrap_or_default();
            let arg = |names: &[&str]| {
                args.iter()
                    .position(|a| names.contains(&a.as_str()))
                    .and_then(|i| args.get(i + 1))
                    .cloned()
            };
            let ctx = s.llama_server_n_ctx.map(u64::from).or_else(|| {
                arg(&["-c", "--ctx-size"]).and_then(|c| c.parse().ok()).filter(|&c| c > 0)
            });
            (ctx, arg(&["-ctk", "--cache-type-k"]), arg(&["-ctv", "--cache-type-v"]))
        }
        _ => return None,
    };
    // Unset, llama.cpp sizes the context to the model's training context.
    let n_ctx = n_ctx.or(shape.context_length)?;
    let type_k = type_k.unwrap_or_else(|| "f16".into()).to_ascii_lowercase();
    let type_v = type_v.unwrap_or_else(|| "f16".into()).to_ascii_lowercase();
    let kv_cache_mib = shape.kv_cache_bytes(n_ctx, &type_k, &type_v)?.div_ceil(1 << 20);
    let mib = (weights_mib + kv_cache_mib).saturating_mul(u64::from(replicas));
    let layers = shape.block_count;
    Some(GgufEstimate {
        mib,
        replica_count: replicas,
        weights_mib,
        kv_cache_mib,
        n_ctx,
        type_k,
        type_v,
        layers,
    })
}
