//! Hangar's backend contract.
//!
//! This crate owns what every engine adapter implements and what the rest of Hangar may
//! assume about engines:
//!
//! - the [`Backend`] trait (load one replica of a model → a [`Runtime`]) and the [`Runtime`]
//!   trait (generate, embed, rerank, health, sleep and wake, unload);
//! - [`Capabilities`] as data (modalities, multi-turn, thinking modes, parallel sequences);
//! - the error taxonomy: [`LoadError`] (not-found vs other load failures, which drive
//!   different eviction rules) and [`RuntimeError`] (crash vs bad request vs cancelled);
//! - [`ForwardRequest`] / [`ForwardResponse`]: pass-through of OpenAI-compatible requests to
//!   engines that serve that API themselves, and [`ModelLogs`], the followable log of a
//!   model's engine, which every load hands its engine ([`LoadRequest::logs`]).
//!
//! What engines share beyond the contract lives in crates named for it: the prompt formats in
//! `hangar-prompt`, the stub engine and its pretend GPU in `hangar-stub`, what a load may
//! override and the presets for it in `hangar-config`, and the wake-up coalescing future of
//! HTTP tasks in `hangar-coalesce`.
//!
//! It knows nothing of HTTP, scheduling or eviction.

mod error;
mod forward;
mod logs;
mod types;

use std::sync::Arc;

use async_trait::async_trait;
use hangar_config::{BackendKind, ModelConfig};
use tokio::sync::mpsc;

pub use error::{LoadError, RuntimeError};
pub use forward::{ForwardRequest, ForwardResponse, ForwardRoute};
pub use logs::{
    LOG_CAPACITY, LOG_MAX_BYTES, LOG_MAX_LINE_BYTES, LogBounds, LogLine, LogStream, ModelLogs,
    cut_line,
};
pub use types::*;

/// Engine-specific facts about a loaded replica, by name ([`Runtime::details`]).
pub type RuntimeDetails = serde_json::Map<String, serde_json::Value>;

/// An engine that can load models of one [`BackendKind`].
///
/// Implementations are cheap to share (`Arc<dyn Backend>`); all per-model state lives in
/// the [`Runtime`] a load returns.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The backend kind this engine serves.
    fn kind(&self) -> BackendKind;

    /// What a model would support once loaded, known from its config alone (the admin API
    /// shows capabilities of unloaded models too).
    fn capabilities(&self, model: &ModelConfig) -> Capabilities;

    /// Loads one replica of `request.model`. Each call returns an independent runtime; the
    /// caller loads `replicas` of them and drops them all if any fails.
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when the model's artifact does not exist (no eviction is
    /// attempted for these), any other [`LoadError`] for everything else.
    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError>;

    /// Checks, before anything is evicted to make room, that a load of `model` can start at
    /// all (an interpreter and the engine's packages are installed, …). Ok by default.
    ///
    /// # Errors
    /// The [`LoadError`] the load fails with; nothing is evicted for it.
    async fn preflight(&self, model: &ModelConfig) -> Result<(), LoadError> {
        let _ = model;
        Ok(())
    }

    /// Whether this engine's runtimes pass OpenAI-compatible requests through
    /// ([`Runtime::forward`]) instead of taking typed ones. False by default.
    fn forwards(&self) -> bool {
        false
    }
}

/// What [`Backend::load`] needs.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    /// The effective model definition: config with the load's overrides applied.
    pub model: Arc<ModelConfig>,
    /// Which replica this is (0-based), for logs and port allocation.
    pub replica: u32,
    /// How many replicas this load creates (the engine may split resources between them).
    pub replicas: u32,
    /// Where the backend reports load progress in `[0, 1]`; may be ignored.
    pub progress: ProgressSink,
    /// Where the runtime reports that its engine died while loaded (a child process
    /// exited); the model is then marked failed with that reason.
    pub crash: CrashSink,
    /// The model's log, where the engine's output goes.
    pub logs: ModelLogs,
    /// The GPUs the runtime is placed on, by NVML index (PCI bus order), ascending; empty:
    /// no placement (the engine uses the GPUs it would alone). Child processes get them as
    /// `CUDA_VISIBLE_DEVICES` under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (see
    /// [`cuda_environment`]), in-process engines as device indices.
    pub gpus: Vec<u32>,
    /// Where the engine may save its prompt caches when it unloads or sleeps, and restore
    /// them from; `None`: nowhere (no `state_dir`, or a bound of 0).
    pub prompt_cache: Option<PromptCacheRoot>,
}

/// The root of the saved prompt caches (`<state_dir>/prompt-cache`) and its byte bound,
/// shared by every model (see the `hangar-prompt-cache` crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptCacheRoot {
    /// The folder; each model saves in a folder of its own under it.
    pub dir: std::path::PathBuf,
    /// What every model's saved caches together may take, in bytes.
    pub max_bytes: u64,
}

impl LoadRequest {
    /// Replica `replica` of `replicas` for `model`, with no-op progress and crash sinks and
    /// a fresh log.
    pub fn new(model: Arc<ModelConfig>, replica: u32, replicas: u32) -> Self {
        Self {
            model,
            replica,
            replicas,
            progress: ProgressSink::default(),
            crash: CrashSink::default(),
            logs: ModelLogs::default(),
            gpus: Vec::new(),
            prompt_cache: None,
        }
    }
}

/// The environment that confines a child engine to `gpus` (NVML indices, PCI bus order):
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA numbers the GPUs as NVML does and not fastest
/// first, and `CUDA_VISIBLE_DEVICES` naming them. Nothing for no placement, or when the
/// model's own environment (`configured`) already names `CUDA_VISIBLE_DEVICES`: a
/// hand-written choice is kept (and admission used its GPUs).
pub fn cuda_environment(gpus: &[u32], configured: &[(String, String)]) -> Vec<(String, String)> {
    if gpus.is_empty() || configured.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES") {
        return Vec::new();
    }
    let visible: Vec<String> = gpus.iter().map(u32::to_string).collect();
    vec![
        ("CUDA_DEVICE_ORDER".to_owned(), "PCI_BUS_ID".to_owned()),
        ("CUDA_VISIBLE_DEVICES".to_owned(), visible.join(",")),
    ]
}

/// A loaded replica of a model.
///
/// Dropping the last `Arc` to a runtime must release its resources; [`Runtime::unload`] is
/// the graceful way and is what Hangar calls.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// What this runtime supports.
    fn capabilities(&self) -> &Capabilities;

    /// What the engine made of the model's settings for this replica (threads, context,
    /// parallel sequences, …): engine-specific facts for operators, shown in the admin row.
    /// Empty by default.
    fn details(&self) -> RuntimeDetails {
        RuntimeDetails::new()
    }

    /// The process serving this replica when the engine runs in a child process (the root
    /// of its process tree, whose GPU memory the runtime measures); `None` in-process or
    /// remote. Default `None`.
    fn pid(&self) -> Option<u32> {
        None
    }

    /// Generates text for `request`, sending each piece to `events` as it is produced.
    ///
    /// Cancellation: when `events` is closed (the receiver dropped) the runtime stops
    /// generating and returns [`RuntimeError::Cancelled`]. Dropping the returned future also
    /// cancels.
    ///
    /// # Errors
    /// [`RuntimeError::Crashed`] when the engine died (the model must be marked failed),
    /// other variants for request-level problems.
    async fn generate(
        &self,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError>;

    /// The prompt tokens [`Runtime::generate`] would read for `request` (its usage's
    /// `prompt_tokens`): the prompt rendered and tokenized as a generation would, nothing
    /// generated.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for an engine that cannot count without generating (the
    /// default), or as [`Runtime::generate`].
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u32, RuntimeError> {
        let _ = request;
        Err(RuntimeError::Unsupported {
            message: "this engine cannot count prompt tokens without generating".into(),
        })
    }

    /// Embeds each input.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for models that are not embedding models, or as
    /// [`Runtime::generate`].
    async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, RuntimeError>;

    /// Scores each document against the query.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for models that are not reranking models, or as
    /// [`Runtime::generate`].
    async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, RuntimeError>;

    /// Whether the engine is still alive.
    ///
    /// # Errors
    /// [`RuntimeError::Crashed`] with the reason when it is not.
    async fn health(&self) -> Result<(), RuntimeError>;

    /// Releases the runtime's resources (process, memory). Called once, after in-flight
    /// work has drained.
    async fn unload(&self);

    /// Puts the runtime to sleep at `level`, one of its [`Capabilities::sleep_levels`]: it
    /// gives back what the level says and keeps the rest, and serves nothing until
    /// [`Runtime::wake`]. Called with no request in flight; asleep already is Ok.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for a runtime that cannot sleep (the default) or not at
    /// `level`; [`RuntimeError::Crashed`] when the engine died; other variants when the
    /// engine refused (it then serves as before).
    async fn sleep(&self, level: SleepLevel) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported {
            message: format!("this engine cannot sleep (level {})", level.as_str()),
        })
    }

    /// Wakes a sleeping runtime: it takes back what sleep gave back and serves again.
    /// Awake already is Ok.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for a runtime that cannot sleep (the default);
    /// [`RuntimeError::Crashed`] when the engine died; [`RuntimeError::Failed`] when it
    /// could not take its memory back (it stays asleep).
    async fn wake(&self) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported { message: "this engine cannot sleep".into() })
    }

    /// Whether this runtime passes OpenAI-compatible requests through to its engine
    /// ([`Runtime::forward`]) instead of taking typed ones. False by default.
    fn forwards(&self) -> bool {
        false
    }

    /// Passes `request` through to the engine and returns its answer as it arrives.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for runtimes that do not forward (the default);
    /// [`RuntimeError::Crashed`] when the engine died; [`RuntimeError::Upstream`] and
    /// [`RuntimeError::InvalidRequest`] for the engine's own error answers.
    async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, RuntimeError> {
        let _ = request;
        Err(RuntimeError::Unsupported { message: "this engine does not forward requests".into() })
    }
}
