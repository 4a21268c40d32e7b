//! The manager's error type and the one list of machine-readable error codes.

use hangar_backend::{RuntimeError, ThinkingMode};
use hangar_config::ModelType;
use hangar_config::OverrideError;
use hangar_lifecycle::{AdmissionError, ModelState};
use serde::{Deserialize, Serialize};

use crate::snapshot::ModelSnapshot;

/// Why a manager operation did not do what was asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The request was not admitted to the model (unknown, not loaded, loading, unloading,
    /// failed, queue full).
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The model's state does not allow the operation now (load while unloading, unload
    /// while loading, other options for a model that is already loading).
    #[error("{message}")]
    Conflict {
        /// The model's state.
        state: ModelState,
        /// What conflicts.
        message: String,
    },
    /// Load options that fail the request schema (wrong type, non-positive integer,
    /// unknown field).
    #[error("{field}: {message}")]
    InvalidLoadSchema {
        /// The offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Load options that are well-formed but wrong for this model's backend or state.
    #[error("{}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    InvalidLoadRequest {
        /// The offending field, when one is to blame.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The load ran and failed. After a load the model is `failed` and its `last_error`
    /// says why; after a failed reload the previous runtimes keep serving.
    #[error("{message}")]
    LoadFailed {
        /// What failed, starting with "load failed" or "reload failed".
        message: String,
        /// The model after the attempt.
        snapshot: Box<ModelSnapshot>,
    },
    /// The request asks for work the model's type does not do (embeddings from an llm,
    /// chat from an embedding model). Checked before admission, so nothing is loaded.
    #[error("model '{model}' is of type {model_type}; {work} needs a model of type {needs}")]
    ModelTypeMismatch {
        /// The model.
        model: String,
        /// Its type.
        model_type: ModelType,
        /// What the request asked for.
        work: &'static str,
        /// The type that does it.
        needs: ModelType,
    },
    /// The request's `thinking` mode is not one the model advertises.
    #[error(
        "model '{model}' does not support thinking `{requested}`; its thinking_modes are [{}]",
        supported.iter().map(ThinkingMode::as_str).collect::<Vec<_>>().join(", ")
    )]
    ThinkingUnsupported {
        /// The model.
        model: String,
        /// The mode asked for.
        requested: ThinkingMode,
        /// The model's `capabilities.thinking_modes`.
        supported: Vec<ThinkingMode>,
    },
    /// More than one user message for a single-turn model (`capabilities.multi_turn` false).
    #[error(
        "model '{model}' is single-turn (capabilities.multi_turn is false): send one user message, got {user_turns}"
    )]
    SingleTurn {
        /// The model.
        model: String,
        /// User messages in the request.
        user_turns: usize,
    },
    /// The request reached a runtime and failed there.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Another admin operation on the model held its admin turn for longer than
    /// `admin_lock_timeout`; nothing was done.
    #[error(
        "another admin operation on model '{model}' has been running for over {} s; try again later",
        waited.as_secs_f64()
    )]
    AdminBusy {
        /// The model.
        model: String,
        /// How long this call waited.
        waited: std::time::Duration,
    },
    /// A weight update while requests run, without `abort_all_requests` and without a
    /// `retract` pause; nothing was done.
    #[error(
        "model '{model}' has {running} running request(s); pause it with mode retract first, or set abort_all_requests"
    )]
    RequestsActive {
        /// The model.
        model: String,
        /// Requests running.
        running: u32,
    },
    /// The weights checker could not read the model's weights (none configured, unreadable
    /// or unparsable files), or `compare` found no snapshot.
    #[error("{message}")]
    Weights {
        /// What is wrong.
        message: String,
    },
    /// No live lease of that id on the model.
    #[error("model '{model}' has no lease '{id}' (released or expired)")]
    LeaseNotFound {
        /// The model.
        model: String,
        /// The lease id asked for.
        id: String,
    },
    /// The model already has `limits.max_leases_per_model` live leases; nothing was done.
    #[error(
        "model '{model}' already has {limit} live leases (limits.max_leases_per_model); release or let one expire first"
    )]
    TooManyLeases {
        /// The model.
        model: String,
        /// The cap.
        limit: u32,
    },
    /// The request ran past `limits.request_timeout_s` and was cancelled; its slot is free.
    #[error(
        "the request to model '{model}' ran past its deadline of {} s (limits.request_timeout_s) and was cancelled",
        timeout.as_secs()
    )]
    DeadlineExceeded {
        /// The model.
        model: String,
        /// The deadline, counted from the moment the request got its slot.
        timeout: std::time::Duration,
    },
    /// The load could only proceed by evicting held (pinned or leased) models; nothing was
    /// evicted.
    #[error(
        "no room to load model '{model}' without evicting pinned or leased model(s): {}; release their leases or unload one of them",
        held.join(", ")
    )]
    SlotsPinned {
        /// The model that was to load.
        model: String,
        /// The held models in the way.
        held: Vec<String>,
    },
    /// The model does not fit in the VRAM budget even after evicting every model that may
    /// be evicted; nothing was evicted.
    #[error("{}", vram_message(model, shortfall))]
    InsufficientVram {
        /// The model that was to load.
        model: String,
        /// What it needs, what is free and missing, and who holds the memory.
        shortfall: Box<hangar_eviction::VramShortfall>,
    },
    /// A load on demand of a model whose last load failed inside its engine after every model
    /// that may be evicted on its devices was evicted, with nothing freed since: refused at
    /// once, nothing evicted (`control/step/exhaust.rs`).
    #[error(
        "model '{model}' is not loaded on demand: its last load failed after every model that may be evicted on its devices was evicted, and nothing was unloaded since ({last_error}); unload a model or load it explicitly to try again"
    )]
    LoadExhausted {
        /// The model that was to load.
        model: String,
        /// It loads on a GPU (else in host memory).
        gpu: bool,
        /// Its last load's error.
        last_error: String,
    },
    /// A second copy (a reload, a weight update) of a model whose memory nothing tells: it
    /// was not measured when it loaded (an earlier unload's memory had not shown as
    /// released, or the GPUs do not list processes) and its files give no estimate.
    /// Counted as zero, the two copies could run past the budget; nothing was done.
    #[error(
        "the {} memory a second copy of model '{model}' takes is not known (it was not measured when the model loaded, and its files give no estimate), so it is not admitted under the budget; unload the model and load it again instead",
        if *gpu { "GPU" } else { "host" }
    )]
    MemoryNotKnown {
        /// The model.
        model: String,
        /// GPU memory (else host memory).
        gpu: bool,
    },
    /// A model on the CPU does not fit in the host-memory budget (`ram_budget`) even after
    /// evicting every model that may be evicted; nothing was evicted.
    #[error(
        "model '{model}' needs {} MiB of host memory but the host-memory budget has {} MiB free; {} MiB are missing even after evicting every model that may be evicted (host memory held by: {})",
        shortfall.needed_mib,
        shortfall.free_mib,
        shortfall.missing_mib,
        holders(shortfall)
    )]
    InsufficientMemory {
        /// The model that was to load.
        model: String,
        /// What it needs, what is free and missing, and which models hold the memory.
        shortfall: Box<hangar_eviction::VramShortfall>,
    },
    /// A call that acts on one model named none, and more (or no) models are loaded.
    #[error("{message}")]
    ModelRequired {
        /// Which models are loaded.
        message: String,
    },
    /// An operation Hangar deliberately does not perform.
    #[error("{message}")]
    NotImplemented {
        /// What is refused, and what to do instead.
        message: String,
    },
    /// A read-only weights check (the checker's `GET` form) would have paused the loaded
    /// model, which serves requests: nothing was done.
    #[error(
        "model '{model}' is loaded and serving: a {action} would pause it, which a read-only check may not do; use POST"
    )]
    WouldPause {
        /// The model.
        model: String,
        /// The action asked for (`checksum`, `compare`).
        action: &'static str,
    },
    /// The model failed too often and is quarantined: requests, auto-loads and lease loads
    /// are refused until it ends; an explicit load lifts it.
    #[error(
        "model '{model}' is quarantined after {} failed loads or crashes (last: {last_error}); retry after {} s, or load it explicitly",
        quarantine.failures, quarantine.retry_after_s
    )]
    Quarantined {
        /// The model.
        model: String,
        /// The quarantine.
        quarantine: crate::QuarantineInfo,
        /// Its last failure's message.
        last_error: String,
    },
}

/// "load failed: <reason>", without doubling the prefix the backend's reason may carry.
pub(crate) fn load_failed_message(reason: &str) -> String {
    if reason.starts_with("load failed") {
        reason.to_owned()
    } else {
        format!("load failed: {reason}")
    }
}

impl From<OverrideError> for ManagerError {
    fn from(e: OverrideError) -> Self {
        match e {
            OverrideError::Schema { field, message } => Self::InvalidLoadSchema { field, message },
            OverrideError::Invalid { field, message } => {
                Self::InvalidLoadRequest { field, message }
            }
            other => Self::InvalidLoadRequest { field: None, message: other.to_string() },
        }
    }
}

/// Every machine-readable error code Hangar's control plane produces: the JSON `code` of
/// error responses and the `outcome` label of metrics.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    /// No such model in config.
    UnknownModel,
    /// The model is unloaded.
    ModelNotLoaded,
    /// The model is loading.
    ModelLoading,
    /// The model is unloading.
    ModelUnloading,
    /// The model's last load failed or its runtime crashed.
    ModelFailed,
    /// The model's request queue is full.
    QueueFull,
    /// The model's state does not allow the operation now (e.g. unload while loading);
    /// `runtime_state` says which state.
    StateConflict,
    /// The request's `thinking` mode is not one of the model's `thinking_modes`.
    ThinkingUnsupported,
    /// The request asks for work the model's type does not do.
    ModelTypeMismatch,
    /// Load options fail the request schema.
    InvalidRequestBody,
    /// Load options are wrong for the model's backend or state.
    InvalidLoadRequest,
    /// The load ran and failed.
    LoadFailed,
    /// The runtime crashed while serving the request.
    BackendCrashed,
    /// The request was cancelled by its caller.
    Cancelled,
    /// The request is not valid for the model.
    InvalidRequest,
    /// The model does not support the operation.
    Unsupported,
    /// The engine failed the request.
    RuntimeError,
    /// A forwarding engine answered with an error of its own.
    UpstreamError,
    /// A forwarding engine's answer was larger than `limits.max_answer_bytes`.
    UpstreamAnswerTooLarge,
    /// The engine could not be reached or did not answer in time.
    BackendUnavailable,
    /// Another admin operation on the model held it longer than `admin_lock_timeout`.
    AdminBusy,
    /// An operator aborted the request (a pause with mode `abort`, a weight update with
    /// `abort_all_requests`).
    GenerationAborted,
    /// A weight update while requests run.
    RequestsActive,
    /// The model's weights could not be read or parsed.
    WeightsUnreadable,
    /// An operation Hangar deliberately does not perform.
    NotImplemented,
    /// No live lease of that id.
    LeaseNotFound,
    /// A load would need held (pinned or leased) models evicted.
    SlotsPinned,
    /// The model failed too often; refused until its quarantine ends or an explicit load.
    ModelQuarantined,
    /// The model does not fit in the VRAM budget.
    InsufficientVram,
    /// A model on the CPU does not fit in the host-memory budget.
    InsufficientMemory,
    /// A read-only weights check would have paused the loaded model.
    WouldPause,
    /// The model already has `limits.max_leases_per_model` live leases.
    TooManyLeases,
    /// The request ran past `limits.request_timeout_s` and was cancelled.
    DeadlineExceeded,
}

impl ErrorCode {
    /// The snake_case code.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl ManagerError {
    /// This error's code.
    pub fn code(&self) -> ErrorCode {
        // Exhaustive over the lower crates' errors too: a new variant there does not compile
        // until it has its code here, the one code vocabulary.
        use hangar_backend::RuntimeError as R;
        use hangar_lifecycle::AdmissionError as A;
        match self {
            Self::Admission(e) => match e {
                A::UnknownModel { .. } => ErrorCode::UnknownModel,
                A::ModelNotLoaded => ErrorCode::ModelNotLoaded,
                A::ModelLoading => ErrorCode::ModelLoading,
                A::ModelUnloading => ErrorCode::ModelUnloading,
                A::ModelFailed { .. } => ErrorCode::ModelFailed,
                A::QueueFull { .. } => ErrorCode::QueueFull,
                A::GenerationAborted { .. } => ErrorCode::GenerationAborted,
            },
            Self::Conflict { .. } => ErrorCode::StateConflict,
            Self::ModelTypeMismatch { .. } => ErrorCode::ModelTypeMismatch,
            Self::ThinkingUnsupported { .. } => ErrorCode::ThinkingUnsupported,
            Self::SingleTurn { .. } => ErrorCode::InvalidRequest,
            Self::InvalidLoadSchema { .. } => ErrorCode::InvalidRequestBody,
            Self::InvalidLoadRequest { .. } => ErrorCode::InvalidLoadRequest,
            Self::LoadFailed { .. } => ErrorCode::LoadFailed,
            Self::AdminBusy { .. } => ErrorCode::AdminBusy,
            Self::RequestsActive { .. } => ErrorCode::RequestsActive,
            Self::Weights { .. } => ErrorCode::WeightsUnreadable,
            Self::NotImplemented { .. } => ErrorCode::NotImplemented,
            Self::ModelRequired { .. } => ErrorCode::InvalidRequest,
            Self::LeaseNotFound { .. } => ErrorCode::LeaseNotFound,
            Self::TooManyLeases { .. } => ErrorCode::TooManyLeases,
            Self::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded,
            Self::SlotsPinned { .. } => ErrorCode::SlotsPinned,
            Self::InsufficientVram { .. } => ErrorCode::InsufficientVram,
            Self::InsufficientMemory { .. } => ErrorCode::InsufficientMemory,
            Self::LoadExhausted { gpu: true, .. } => ErrorCode::InsufficientVram,
            Self::LoadExhausted { gpu: false, .. } => ErrorCode::InsufficientMemory,
            Self::MemoryNotKnown { gpu: true, .. } => ErrorCode::InsufficientVram,
            Self::MemoryNotKnown { gpu: false, .. } => ErrorCode::InsufficientMemory,
            Self::Quarantined { .. } => ErrorCode::ModelQuarantined,
            Self::WouldPause { .. } => ErrorCode::WouldPause,
            Self::Runtime(e) => match e {
                R::Crashed { .. } => ErrorCode::BackendCrashed,
                R::Cancelled => ErrorCode::Cancelled,
                R::InvalidRequest { .. } => ErrorCode::InvalidRequest,
                R::Unsupported { .. } => ErrorCode::Unsupported,
                R::Failed { .. } => ErrorCode::RuntimeError,
                R::Upstream { .. } => ErrorCode::UpstreamError,
                R::AnswerTooLarge { .. } => ErrorCode::UpstreamAnswerTooLarge,
                R::Unavailable { .. } => ErrorCode::BackendUnavailable,
            },
        }
    }
}

/// `"a 6000 MiB (held), b 1000 MiB"`, or `"no model"`.
/// What an `insufficient_vram` refusal says: no GPU set to place the model on, or what the
/// closest GPU lacks.
fn vram_message(model: &str, short: &hangar_eviction::VramShortfall) -> String {
    let n = short.gpus_needed.max(1);
    if short.gpus.len() < n as usize && short.holders.is_empty() && short.free_mib == 0 {
        return format!(
            "model '{model}' spreads over {n} GPU(s) at once, but only {} of the GPUs it may use (its `gpus`, or the load's) are GPUs Hangar may use here; nothing was evicted",
            short.gpus.len()
        );
    }
    let closest =
        match short.gpus.iter().min_by_key(|g| (g.missing_mib, std::cmp::Reverse(g.free_mib))) {
            Some(g) if short.gpus.len() > 1 => format!(" (the closest of its GPUs, GPU {})", g.gpu),
            _ => String::new(),
        };
    let each = if n > 1 { format!(" on each of {n} GPUs") } else { String::new() };
    format!(
        "model '{model}' needs {} MiB of GPU memory{each} but the VRAM budget has {} MiB free{closest}; {} MiB are missing even after evicting every model that may be evicted (GPU memory held by: {})",
        short.needed_mib,
        short.free_mib,
        short.missing_mib,
        holders(short)
    )
}

fn holders(short: &hangar_eviction::VramShortfall) -> String {
    let each: Vec<String> = short
        .holders
        .iter()
        .map(|(name, mib, held)| format!("{name} {mib} MiB{}", if *held { " (held)" } else { "" }))
        .collect();
    if each.is_empty() { "no model".to_owned() } else { each.join(", ") }
}
