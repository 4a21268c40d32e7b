//! The node as a whole, for routers that read one series per name (the Gateway API
//! Inference Extension's model-server protocol, as llm-d's endpoint picker reads a vLLM
//! pod): requests running and waiting over every model, how full the request slots are,
//! the models served and those on their way. Read in one pass over the registry, no row
//! built: a scrape every 50 ms stays cheap at thousands of configured models.

use hangar_lifecycle::ModelState;

use crate::manager::Manager;

/// The node at one moment ([`Manager::node`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Requests running on the replicas of every model (draining ones included).
    pub running: u64,
    /// Requests waiting in the models' queues.
    pub waiting: u64,
    /// Requests the loaded models' replicas run at once: each one's in-flight target times
    /// its replicas.
    pub capacity: u64,
    /// The names the loaded models answer to (aliases included), in config order.
    pub serving: Vec<String>,
    /// The names of the models being loaded (aliases included), in config order.
    pub loading: Vec<String>,
    /// Loaded-model slots for llms (`max_loaded_models.llm`).
    pub llm_slots: u32,
}

impl NodeView {
    /// The share of the loaded models' request slots in use, from 0 to 1 (0 with none
    /// loaded).
    pub fn slots_in_use(&self) -> f64 {
        if self.capacity == 0 { 0.0 } else { (self.running as f64 / self.capacity as f64).min(1.0) }
    }
}

impl Manager {
    /// What the node is doing now (see the module docs).
    pub fn node(&self) -> NodeView {
        let registry = self.registry();
        let mut view = NodeView { llm_slots: self.inner.slots.llm.get(), ..NodeView::default() };
        for entry in &registry.order {
            let slot = entry.lock();
            let state = slot.lifecycle.state();
            if !matches!(state, ModelState::Loaded | ModelState::Loading | ModelState::Unloading) {
                continue;
            }
            // The aliases in effect: a changed definition's apply at once.
            let definition = slot.pending.as_deref().unwrap_or(&entry.config);
            let names = std::iter::once(definition.name.to_string())
                .chain(definition.aliases.iter().map(ToString::to_string));
            match state {
                ModelState::Loaded => view.serving.extend(names),
                ModelState::Loading => view.loading.extend(names),
                _ => {}
            }
            if let Some(stats) = slot.phase.scheduler().map(|s| s.stats()) {
                view.running += u64::from(stats.runtime_inflight);
                view.waiting += stats.queue_depth as u64;
                if state == ModelState::Loaded {
                    let replicas = stats.per_replica.len() as u64;
                    view.capacity += u64::from(stats.effective_target) * replicas;
                }
            }
        }
        view
    }
}
