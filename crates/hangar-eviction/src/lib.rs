//! Hangar's eviction policy: which loaded models must be unloaded before a load may start.
//!
//! This crate owns the *decision* and nothing else. It is pure and synchronous: no clocks
//! (every model's `last_use` is passed in), no async, no I/O. The runtime gathers the
//! loaded models, asks for a plan, and executes it (draining busy victims, unloading, then
//! loading). "Decide, then do."
//!
//! The rules, from the multi-model spec and Hangar's reading of it:
//!
//! - **Slots per type** ([`plan_load`]). A model of type `T` needs a free slot among the
//!   `max_loaded_models` slots of `T`. When none is free, the least recently used models of
//!   type `T` are evicted until one is ([`EvictionReason::SlotLimit`]). Models of other
//!   types are never evicted for slot reasons. LRU ties break by model name.
//! - **Busy models** are never killed mid-request. Among the candidates of type `T`, idle
//!   models (no in-flight work) are chosen first, in LRU order; busy ones are chosen only
//!   when there are not enough idle ones, and are marked [`Victim::wait_for_drain`]. The
//!   spec only says a busy model finishes its work before it is evicted; preferring an idle
//!   victim when one exists means the load does not wait for that work at all.
//! - **Exclusive devices** (the NPU, [`Device::EXCLUSIVE`]). Loading a model that uses one
//!   evicts every other model using it, regardless of type or limits
//!   ([`EvictionReason::ExclusiveDevice`]); such a victim of type `T` also frees a slot of
//!   `T`. A model that does not use an exclusive device never evicts for device reasons.
//! - **Already loaded**: loading a model that is loaded plans nothing.
//! - **GPU memory** ([`plan_load_within`]). With a VRAM budget, the runtime passes what is
//!   free in it and what the incoming model needs ([`Memory`], figures it measured); when
//!   the model does not fit even after the slot and device victims go, the least recently
//!   used models holding GPU memory, of any type, idle first, are evicted until it does
//!   ([`EvictionReason::VramBudget`]). When nothing that may be evicted makes room, the plan
//!   evicts nothing and says how much is missing and who holds the memory
//!   ([`VramShortfall`]).
//! - **GPUs as places** ([`plan_placement`]). Each GPU has its own free memory: the plan
//!   picks which GPU(s) the model goes to (one, or an even share on each of a tensor
//!   split), evicts only on the GPUs that need room, and refuses with a per-GPU shortfall
//!   before evicting anything when no placement fits (`place.rs` states the rule).
//! - **Load failure** ([`plan_retry_after_failure`]). A not-found failure evicts nothing
//!   and is not retried; any other failure evicts every other loaded model on the failed
//!   one's devices, of every type, and the load is retried once
//!   ([`EvictionReason::LoadFailureRetry`]).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
//! use hangar_eviction::{EvictionReason, Incoming, LoadedModel, plan_load};
//!
//! let now = Instant::now();
//! let llm = |name: &str, secs: u64| LoadedModel {
//!     name: ModelName::new(name).unwrap(),
//!     model_type: ModelType::Llm,
//!     device: Device::GPU,
//!     last_use: now + Duration::from_secs(secs),
//!     inflight: 0,
//!     held: false,
//!     vram_mib: 0,
//!     asleep: false,
//!     sleep_frees_mib: 0,
//! };
//! let loaded = [llm("old", 1), llm("recent", 2)];
//! let limits = MaxLoadedModels::from_counts(&[2]).unwrap();
//! let incoming = Incoming {
//!     name: ModelName::new("new").unwrap(),
//!     model_type: ModelType::Llm,
//!     device: Device::GPU,
//! };
//!
//! let plan = plan_load(&loaded, &incoming, &limits);
//! assert_eq!(plan.names().map(ModelName::as_str).collect::<Vec<_>>(), ["old"]);
//! assert_eq!(plan.victims[0].reason, EvictionReason::SlotLimit);
//! assert!(!plan.must_wait_for_drain());
//! ```
//!
//! [`Device::EXCLUSIVE`]: hangar_config::Device::EXCLUSIVE

mod place;
mod plan;
mod policy;

pub use place::{
    Fit, GpuHolding, GpuRoom, GpuShortfall, Placed, Refusal, plan_placement,
    plan_second_copy_placed,
};
pub use plan::{
    EvictionPlan, EvictionReason, Incoming, LoadFailure, LoadedModel, Memory, Victim, VramShortfall,
};
pub use policy::{plan_load, plan_load_within, plan_retry_after_failure, plan_second_copy};
