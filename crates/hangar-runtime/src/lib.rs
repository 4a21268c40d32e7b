//! Hangar's runtime manager: what another Rust service embeds when it wants model
//! management without HTTP.
//!
//! [`Manager`] composes the layers below it:
//!
//! - a registry of the configured models (a `DashMap` of entries, each with a slot behind
//!   one leaf lock that readers read);
//! - a control loop, one task that owns each model's lifecycle, leases, failures and holds
//!   and decides every change with a pure `step`: each model's admin turn (one admin
//!   operation at a time), the one load lane, who creates or destroys a model's runtimes,
//!   the waits for pinned requests, every lifecycle move, the lease and quarantine rules,
//!   and the grant; it publishes what it decides to the slots;
//! - a load lane that every path creating runtimes takes (a load, a reload, a
//!   weight update), with one grant for all of them: the eviction plan (`hangar-eviction`),
//!   made when the job leaves the queue, not when it enters, executed as graceful unloads,
//!   or a typed refusal (`slots_pinned`, `insufficient_vram`); a model whose runtimes are
//!   being replaced is held; loads are idempotent for the same options, a load in progress
//!   is joined (every caller gets its one typed outcome), and a reload
//!   ([`Manager::reload`]) swaps in new runtimes only once they loaded, the old ones
//!   serving meanwhile;
//! - admission ([`Manager::admit`]): a request is checked against the model's type and
//!   capabilities before anything is loaded, then queued for a replica; the
//!   [`RequestGuard`] runs it and reports a crashed runtime itself;
//! - last-use timestamps, updated at load start and completion and at request start and
//!   completion;
//! - auto-load (global `auto_load`, overridable per model) that pins the model so the
//!   triggering request runs before the model can be evicted;
//! - graceful unload and unload-all; crash handling (a crashed runtime moves its model to
//!   `failed` with the reason, its queued requests get `model_failed`); crash quarantine (a
//!   model that keeps failing is refused with `model_quarantined` until its backoff ends or
//!   an explicit load);
//! - VRAM figures (a subprocess engine's process-tree memory, a load's GPU delta, a GGUF
//!   model's weights plus KV cache, the files' size), kept in `state_dir` across restarts,
//!   and admission by them under a `vram_budget`, each GPU a place of its own: a load is
//!   placed on the GPU(s) where it fits with the fewest evictions, evicts least recently
//!   used idle models there for memory or is refused with `insufficient_vram`, and a load
//!   after an unload waits (bounded) for the driver to show the memory released; models on
//!   the CPU are admitted the same way against a `ram_budget` (`insufficient_memory`);
//! - start-up ([`Manager::load_enabled`]): the enabled models in config order, of each type
//!   as many as it has slots, none evicting another; and readiness
//!   ([`Manager::not_serving`]): each enabled model that is not serving, with a typed reason;
//! - [`ModelSnapshot`], one value per model carrying every field of the admin API's row.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use hangar_stub::StubBackend;
//! use hangar_runtime::{Backends, LoadOptions, Manager};
//!
//! let config = hangar_config::Config::from_value(&serde_json::json!({
//!     "models": { "chat": { "backend": "stub", "stub": { "reply": "hello there" } } }
//! })).unwrap();
//! let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
//! manager.load("chat", LoadOptions::default()).await.unwrap();
//! assert!(manager.model("chat").unwrap().is_loaded);
//! # });
//! ```

mod admission;
mod control;
mod demote;
mod entry;
mod error;
mod estimate;
mod events;
mod evict;
mod gpu;
mod grant;
#[cfg(test)]
mod grant_host_tests;
mod host;
mod journal;
mod lease;
mod load;
mod manager;
mod node;
mod outcome;
mod pause;
mod phase;
mod place;
mod quarantine;
mod registry;
mod sleep;
mod sleep_policy;
mod snapshot;
mod start_up;
mod state;
mod unload;
mod vram;
mod wake_check;
mod weights;

pub use admission::{RequestGuard, Work};
pub use error::{ErrorCode, ManagerError};
pub use estimate::GgufEstimate;
pub use events::{ManagerCounters, StateChange};
pub use gpu::{GpuHolder, GpuMemory, RELEASE_WAIT};
pub use hangar_gpu::{GpuProbe, GpuProcess, GpuReading, Unavailable as GpuUnavailable};
pub use hangar_lifecycle::{AdmissionError, LifecycleEvent, ModelState};
pub use host::{HostFigure, HostMethod};
pub use journal::{
    DefinitionChange, EVENT_CAPACITY, EventKind, Follow, MAX_EVENT_TEXT_BYTES, ManagerEvent,
};
pub use lease::{Lease, LeaseChange, MAX_LEASE_OWNER_BYTES, MAX_LEASE_SECONDS};
pub use manager::{Backends, LoadOptions, Manager};
pub use node::NodeView;
pub use pause::{PauseCause, PauseInfo, PauseMode};
pub use place::{Placement, PlacementSource};
pub use quarantine::{Failure, FailureKind, QuarantineInfo, RECENT_FAILURES};
pub use registry::{ModelChanges, REPOSITORY_READ_DEADLINE};
pub use sleep_policy::Residency;
pub use snapshot::{ModelFilter, ModelSnapshot, ModelStatus, VramEstimateSource};
pub use start_up::{NotServing, NotServingInfo, NotServingReason, StartUp};
pub use state::VRAM_STATE_FILE;
pub use vram::{GpuShare, ProcessTreeFigure, VramDetail, VramMethod};
pub use weights::{WeightUpdate, WeightsAction, WeightsReport};

/// What the weights checker reports about weight files, re-exported from the digests.
pub mod digest {
    pub use hangar_weights::{Comparison, TensorDigest, WeightsDigest, WeightsFormat};
}

/// What callers of the manager say to and hear from engines (requests, their events and
/// summaries, tools, capabilities, load constraints, log lines), re-exported from the
/// engine contract so a server or an embedder depends on the runtime alone.
pub mod engine {
    pub use hangar_backend::{
        Capabilities, ChatMessage, EmbedRequest, FinishReason, ForwardRequest, ForwardRoute,
        GenerateEvent, GenerateRequest, GenerateSummary, LOG_CAPACITY, LogLine, Modality,
        OutputFormat, Prompt, RerankRequest, Role, RuntimeError, SamplingParams, SleepLevel,
        ThinkingMode, ToolCall, ToolChoice, ToolDefinition, ToolUse, Translation,
    };
    pub use hangar_coalesce::Coalesced;
    pub use hangar_config::{
        LoadConstraints, LoadRecommendations, load_constraints, load_recommendations,
    };
}
