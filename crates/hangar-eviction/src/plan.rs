//! The values the policy reads ([`LoadedModel`], [`Incoming`], [`LoadFailure`]) and the
//! plan it returns ([`EvictionPlan`] of [`Victim`]s).

use std::time::Instant;

use hangar_config::{Device, ModelName, ModelType};

/// A model currently loaded (state `loaded`), as the policy sees it.
///
/// Names in one slice of loaded models are expected to be unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedModel {
    /// The model's name.
    pub name: ModelName,
    /// Which `max_loaded_models` slots it occupies.
    pub model_type: ModelType,
    /// The devices it occupies.
    pub device: Device,
    /// Last access: load start/complete, request start/complete.
    pub last_use: Instant,
    /// Requests running or admitted (pinned) on it right now, including requests that
    /// triggered an auto-load and have not started yet.
    pub inflight: u32,
    /// Pinned by config or held by a lease: never a victim.
    pub held: bool,
    /// The GPU memory it holds, in MiB, as best known (0: none, or not on a GPU). Only
    /// [`plan_load_within`](crate::plan_load_within) reads it.
    pub vram_mib: u64,
    /// Its runtimes sleep (Hangar's warm tier): among idle models, a slot goes from a
    /// sleeping one first.
    pub asleep: bool,
    /// The GPU memory a sleep of it would give back, in MiB, as best known (0: it cannot
    /// sleep, sleeps already, or nobody knows). The runtime's grant may put it to sleep
    /// instead of unloading it for memory; the policy here does not read it.
    pub sleep_frees_mib: u64,
}

impl LoadedModel {
    /// True when no request is running or admitted on the model.
    pub fn is_idle(&self) -> bool {
        self.inflight == 0
    }

    /// True when the model occupies a device only one model may hold
    /// ([`Device::EXCLUSIVE`]).
    pub fn holds_exclusive_device(&self) -> bool {
        self.device.intersects(Device::EXCLUSIVE)
    }
}

/// The model about to be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// The model's name.
    pub name: ModelName,
    /// Which `max_loaded_models` slots it needs.
    pub model_type: ModelType,
    /// The devices it will occupy.
    pub device: Device,
}

/// Why a model is to be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum EvictionReason {
    /// The incoming model's type has no free slot; this is the least recently used model of
    /// that type.
    SlotLimit,
    /// The incoming model needs an exclusive device (the NPU) this model holds.
    ExclusiveDevice,
    /// A load failed for a reason other than not-found; everything else is unloaded before
    /// the one retry.
    LoadFailureRetry,
    /// The incoming model does not fit in the GPU memory budget; this least recently used
    /// model's memory is needed.
    VramBudget,
}

impl EvictionReason {
    /// The snake_case name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One model the plan unloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// The model to unload.
    pub name: ModelName,
    /// Why it is unloaded.
    pub reason: EvictionReason,
    /// True when the victim has in-flight work: the runtime must let it drain (graceful
    /// unload) before the load proceeds; it is never killed mid-request.
    pub wait_for_drain: bool,
}

impl Victim {
    pub(crate) fn of(model: &LoadedModel, reason: EvictionReason) -> Self {
        Self { name: model.name.clone(), reason, wait_for_drain: !model.is_idle() }
    }
}

/// What to do before a load may start: unload `victims`, in order.
///
/// An empty plan means the load may start at once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EvictionPlan {
    /// The models to unload, in the order they should be unloaded. Each appears once.
    pub victims: Vec<Victim>,
    /// Held (pinned or leased) models the load could only proceed by evicting. When not
    /// empty the load must fail (`slots_pinned`, naming them) and `victims` is empty:
    /// nothing is evicted for a load that cannot happen.
    pub blocked_by: Vec<ModelName>,
    /// Set when the incoming model cannot fit in the GPU memory budget even after evicting
    /// every model that may be evicted: the load must fail (`insufficient_vram`) and
    /// `victims` is empty.
    pub shortfall: Option<VramShortfall>,
}

/// GPU memory as a load's admission sees it, summed over the GPUs, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The budget minus the memory in use now (negative when over budget).
    pub free_mib: i64,
    /// What the incoming model is expected to take.
    pub needed_mib: u64,
}

/// Why a model cannot fit in the GPU memory budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VramShortfall {
    /// What the incoming model is expected to take, in MiB.
    pub needed_mib: u64,
    /// The budget left now, in MiB (negative when over budget).
    pub free_mib: i64,
    /// What is still missing after evicting every model that may be evicted, in MiB.
    pub missing_mib: u64,
    /// Loaded models holding GPU memory, with their figures, largest first: the held
    /// (pinned or leased) ones are why evicting cannot make room.
    pub holders: Vec<(ModelName, u64, bool)>,
    /// Each allowed GPU's side when GPUs are separate places ([`crate::plan_placement`]);
    /// empty for the pooled rule, or when fewer GPUs exist than the model spreads over.
    pub gpus: Vec<crate::GpuShortfall>,
    /// How many GPUs the model needs at once (1 unless it is split).
    pub gpus_needed: u32,
}

impl EvictionPlan {
    /// True when nothing needs to be unloaded.
    pub fn is_empty(&self) -> bool {
        self.victims.is_empty()
    }

    /// True when the load cannot proceed without evicting a held model.
    pub fn is_blocked(&self) -> bool {
        !self.blocked_by.is_empty()
    }

    /// True when the load cannot fit in the GPU memory budget whatever is evicted.
    pub fn is_short_of_vram(&self) -> bool {
        self.shortfall.is_some()
    }

    /// How many models are to be unloaded.
    pub fn len(&self) -> usize {
        self.victims.len()
    }

    /// The victims' names, in unload order.
    pub fn names(&self) -> impl Iterator<Item = &ModelName> {
        self.victims.iter().map(|v| &v.name)
    }

    /// The victim named `name`, if the plan unloads it.
    pub fn get(&self, name: &str) -> Option<&Victim> {
        self.victims.iter().find(|v| v.name.as_str() == name)
    }

    /// True when the plan unloads the model named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// True when some victim has in-flight work the load must wait for.
    pub fn must_wait_for_drain(&self) -> bool {
        self.victims.iter().any(|v| v.wait_for_drain)
    }
}

/// How a load failed, as far as the policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LoadFailure {
    /// The model's files were not found on disk: evicting other models cannot help.
    NotFound,
    /// Any other failure (possibly out of memory): evict everything else and retry once.
    Other,
}
