//! The load lanes, where every path that creates runtimes takes its turn ([`Lane`]), and
//! making room for a load: the eviction plan (slots, exclusive devices, the VRAM budget)
//! made when the load leaves the queue, and its execution as graceful unloads.

use std::sync::Arc;

use hangar_backend::{LoadError, Runtime};
use hangar_config::LoadOverride;
use hangar_config::{ModelConfig, ModelName};
use hangar_eviction::{EvictionPlan, Incoming, LoadedModel};
use hangar_lifecycle::ModelState;
use tokio::time::Instant;

use crate::control::{GrantAsk, ModelId};
use crate::entry::ModelEntry;
use crate::events::Events;
use crate::grant::{Ask, Refusal};
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::outcome::Outcome;
use crate::place::Placement;
use crate::unload::UnloadCause;

/// What a path that creates runtimes asks for.
pub(crate) struct Creation {
    pub(crate) model: Arc<ModelConfig>,
    pub(crate) replicas: u32,
    pub(crate) load_override: LoadOverride,
    pub(crate) ask: Ask,
    /// Whether the GPU memory the runtimes take becomes the model's figure (not for weights
    /// other than its definition's).
    pub(crate) measure: bool,
    /// Whether models whose config says `enabled` are held too (start-up's loads: one
    /// enabled model never evicts another).
    pub(crate) spare_enabled: bool,
}

/// Runtimes a [`Lane`] created, and where they were placed.
pub(crate) struct Created {
    pub(crate) runtimes: Vec<Arc<dyn Runtime>>,
    pub(crate) placement: Option<Placement>,
    /// What they hold on the host, when they run in child processes and were measured.
    pub(crate) host: Option<crate::host::HostFigure>,
}

/// A turn in a load lane, granted by the control loop: the lane of the model's places and
/// its runtimes, held while runtimes are created and until the caller has installed them
/// (dropping it ends the turn).
pub(crate) struct Lane<'a> {
    manager: &'a Manager,
    entry: &'a Arc<ModelEntry>,
    _turn: crate::control::Turn,
}

impl Lane<'_> {
    /// Creates runtimes through the one grant, the same way for every path: the engine's
    /// preflight, the grant and its evictions (`make_room`), the GPU reading before, the
    /// replicas (all or none; a load retries once after evicting everything else), and
    /// the figures.
    ///
    /// # Errors
    /// The [`Outcome`] that says why: refused by the grant, or the engine's failure.
    pub(crate) async fn create(&self, c: &Creation) -> Result<Created, Outcome> {
        let (manager, entry) = (self.manager, self.entry);
        crate::estimate::check_weights(&c.model).await.map_err(|e| Outcome::Failed(e.into()))?;
        let preflight = match manager.inner.backends.get(c.model.backend) {
            None => Err(LoadError::BackendUnavailable { kind: c.model.backend }),
            Some(backend) => backend.preflight(&c.model).await,
        };
        preflight.map_err(|e| Outcome::Failed(e.into()))?;
        let (settled, chosen) = manager.make_room(entry, c).await.map_err(Outcome::Refused)?;
        let overridden = c.load_override.fields().contains_key("gpus");
        let placement = Placement::of(&c.model, chosen, overridden);
        let gpus = placement.as_ref().map(|p| p.gpus.clone()).unwrap_or_default();
        // The delta is read on the placement's GPUs only: other GPUs' memory moves with
        // other models' work.
        let before =
            if settled && c.measure { manager.gpu_used_on(entry, &gpus).await } else { None };
        let local = c.measure && crate::host::local(&c.model);
        // The spec's retry after evicting everything else is a load's; a reload or an
        // update that fails leaves the old runtimes serving and every other model loaded.
        let runtimes = match c.ask {
            Ask::Load => manager.load_with_retry(entry, c, &gpus).await,
            Ask::SecondCopy | Ask::Retry => {
                manager.load_replicas(entry, &c.model, c.replicas, &gpus).await.map_err(Into::into)
            }
        }
        .map_err(Outcome::Failed)?;
        if c.measure {
            manager.record_load(entry, (before, &gpus), &runtimes, &c.load_override).await;
        }
        let host = if local { crate::host::measure(&runtimes) } else { None };
        Ok(Created { runtimes, placement, host })
    }
}

impl Manager {
    /// Waits for `entry`'s turn in the load lane.
    pub(crate) async fn enter_lane<'a>(&'a self, entry: &'a Arc<ModelEntry>) -> Lane<'a> {
        let turn = self.inner.control.create(entry.position).await;
        Lane { manager: self, entry, _turn: turn }
    }

    /// Plans and executes the evictions the creation `c` needs, after the memory of earlier
    /// unloads shows as released, and waits for the victims' memory too. `Ok((settled,
    /// gpus))`: whether every release showed in time (else a GPU delta measured across the
    /// load would be wrong), and the GPUs the grant placed the runtimes on (empty: none).
    ///
    /// # Errors
    /// The [`Refusal`] when held models are in the way or the model cannot fit in the VRAM
    /// budget; nothing was evicted.
    pub(crate) async fn make_room(
        &self,
        entry: &Arc<ModelEntry>,
        c: &Creation,
    ) -> Result<(bool, Vec<u32>), Refusal> {
        let settled = self.wait_for_release(entry).await;
        let (model, replicas, load_override) = (&c.model, c.replicas, &c.load_override);
        let mut demoted = Vec::new();
        let grant = loop {
            let places = self.places_for(entry, model, replicas, load_override).await;
            // A GPU model's part of the host's memory is granted too (a CPU model's
            // `places` are the host's already).
            let host = if crate::host::on_host(model) {
                None
            } else {
                self.host_places(entry, model, replicas, load_override)
            };
            let loaded = self.loaded_models(c.spare_enabled);
            let ask = GrantAsk { ask: c.ask, loaded, incoming: incoming(entry), places, host };
            if let Some(grant) = self.grant_or_demote(entry, ask, &mut demoted).await? {
                break grant;
            }
        };
        self.execute(grant.plan, &entry.config.name).await.map_err(Refusal::Held)?;
        Ok((self.wait_for_release(entry).await && settled, grant.gpus))
    }

    /// Loaded models as the eviction policy sees them, with their model ids; `held` says
    /// what their definitions pin, and with `spare_enabled` the enabled ones too (the grant
    /// adds the control loop's holds).
    pub(crate) fn loaded_models(&self, spare_enabled: bool) -> Vec<(ModelId, LoadedModel)> {
        let mut loaded = Vec::new();
        let registry = self.registry();
        for entry in &registry.order {
            let slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                continue;
            }
            let busy = slot.phase.scheduler().map_or(0, |s| {
                let stats = s.stats();
                stats.runtime_inflight + stats.queue_depth as u32
            });
            loaded.push((
                entry.position,
                LoadedModel {
                    name: entry.config.name.clone(),
                    model_type: entry.config.model_type,
                    device: entry.config.device,
                    last_use: slot.last_use.map_or_else(Instant::now, |(t, _)| t).into_std(),
                    inflight: busy + entry.pins.load(std::sync::atomic::Ordering::SeqCst),
                    held: entry.config.pinned || (spare_enabled && entry.config.enabled),
                    vram_mib: crate::gpu::vram_held(entry, &slot),
                    asleep: slot.phase.serving().is_some_and(|s| s.asleep.is_some()),
                    sleep_frees_mib: crate::sleep_policy::sleep_frees(entry, &slot),
                },
            ));
        }
        loaded
    }

    /// One round of a grant that may put models to sleep: asked with `ask` (read now), the
    /// grant, or `None` when it demoted models. Those are put to sleep, and the caller asks
    /// again (with what their sleeps freed, measured) until a grant comes without
    /// demotions, unloading what is still missing. A model once in `demoted` is not asked
    /// of again, so each round demotes others and the rounds end.
    ///
    /// # Errors
    /// The grant's refusal.
    pub(crate) async fn grant_or_demote(
        &self,
        entry: &Arc<ModelEntry>,
        mut ask: GrantAsk,
        demoted: &mut Vec<ModelName>,
    ) -> Result<Option<crate::grant::Grant>, Refusal> {
        for (_, m) in &mut ask.loaded {
            if demoted.contains(&m.name) {
                m.sleep_frees_mib = 0;
            }
        }
        let grant = self.inner.control.grant(entry.position, ask).await?;
        if grant.demote.is_empty() {
            return Ok(Some(grant));
        }
        for name in grant.demote {
            self.demote(&name, &entry.config.name).await;
            demoted.push(name);
        }
        Ok(None)
    }

    /// Puts `name` to sleep to make room for `incoming` (a demotion), unless an admin
    /// operation holds it now (then it stays as it is; the next grant sees that).
    async fn demote(&self, name: &ModelName, incoming: &ModelName) {
        let Ok(entry) = self.entry(name.as_str()) else { return };
        let Ok(_admin) = self.inner.control.admin_now(entry.position).await else {
            tracing::info!(model = %name, for_model = %incoming, "not put to sleep: an admin operation holds it");
            return;
        };
        tracing::info!(model = %name, for_model = %incoming, "putting to sleep to make room");
        if let Err(error) = self.sleep_entry(&entry, Some(incoming.to_string())).await {
            tracing::warn!(model = %name, %error, "the sleep to make room failed");
        }
    }

    /// Unloads the plan's victims to make room for `incoming`.
    ///
    /// # Errors
    /// The victims a lease took hold of after the plan was made (they stay loaded).
    pub(crate) async fn execute(
        &self,
        plan: EvictionPlan,
        incoming: &ModelName,
    ) -> Result<(), Vec<String>> {
        let mut held = Vec::new();
        for victim in plan.victims {
            let Ok(entry) = self.entry(victim.name.as_str()) else { continue };
            tracing::info!(model = %victim.name, reason = %victim.reason, wait = victim.wait_for_drain, "evicting");
            let reason = victim.reason.as_str().to_owned();
            let evicted = EventKind::Evicted { reason, for_model: incoming.to_string() };
            if self.unload_entry(&entry, UnloadCause::Eviction(evicted)).await {
                Events::bump(&self.inner.events.evictions);
            } else if entry.lock().lifecycle.state() == ModelState::Loaded {
                held.push(victim.name.to_string());
            }
        }
        if held.is_empty() { Ok(()) } else { Err(held) }
    }
}

/// `entry`'s model as the grant sees the one runtimes are created for.
pub(crate) fn incoming(entry: &ModelEntry) -> Incoming {
    let config = &entry.config;
    Incoming { name: config.name.clone(), model_type: config.model_type, device: config.device }
}
