//! Sleep and wake, the warm tier between loaded and unloaded: a loaded model's runtimes
//! give back what other models need (the KV cache, and for engines that can, the weights'
//! GPU memory) and keep what makes them quick to bring back (the engine, the weights in
//! host memory or where they were loaded). The model stays `loaded` (the specs' five
//! states hold): it keeps its slot, counts as ready, and serves once woken.
//!
//! - **Sleep** (the admin turn held): the model's gate closes (its scheduler admits
//!   nothing, as a pause does: new requests wait in its queue), running requests finish,
//!   each runtime answers the wake check (`wake_check.rs`: the reference), then sleeps at
//!   the lightest level every one of its runtimes lists. The loop records it
//!   (`Change::Sleep`), with the GPU memory the sleep gave back (the GPUs' used memory
//!   before and after): admission counts the model as holding that much less while it
//!   sleeps, so a sleeping model makes room for others without being evicted. An engine that cannot sleep is `unsupported` (it would be unloaded
//!   instead); one that refuses leaves the model serving as before.
//! - **Wake**: each runtime wakes and answers the check again, and must agree with its own
//!   reference; then the loop records it and the gate opens (unless an operator's pause
//!   holds it). A runtime that cannot wake, or answers otherwise, fails the model with why
//!   (its runtimes released, as after a crash): a woken engine can say it is healthy and
//!   still answer wrong.
//! - **On demand**: a request for a sleeping model waits in its queue and wakes it
//!   ([`Manager::wake_soon`]: one wake at a time, in the model's admin turn), so it is
//!   counted in the queue like an auto-load; a sleep that finds requests queued when it
//!   ends wakes the model again at once. While an operator's pause holds the model, the
//!   requests wait asleep: the resume wakes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use hangar_backend::{Runtime, RuntimeError, SleepLevel};
use hangar_lifecycle::ModelState;

use crate::control::{Apply, Change};
use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::journal::{EventKind, unix_ms};
use crate::manager::Manager;
use crate::pause::not_loaded;
use crate::snapshot::{ModelSnapshot, snapshot_of};
use crate::wake_check::{self, Answer};

/// The sleep of a model's runtimes, kept with them (`Serving`).
#[derive(Debug, Clone)]
pub(crate) struct Asleep {
    pub(crate) level: SleepLevel,
    pub(crate) since_unix_ms: u64,
    /// Each runtime's answer to the wake check before it slept, in replica order.
    reference: Vec<Answer>,
    /// GPU memory the sleep gave back, as the GPUs' used memory fell across it (on the
    /// model's placement, else every GPU), in MiB: admission counts the model as holding
    /// that much less while it sleeps. 0 without telemetry.
    pub(crate) freed_mib: u64,
}

/// The error of a sleep or wake whose task panicked.
fn panicked(what: &str) -> ManagerError {
    ManagerError::Runtime(RuntimeError::Failed { message: format!("the {what} task panicked") })
}

/// What `runtimes` hold on the host now, for a local model whose engines are child
/// processes (a sleep or wake moves memory there: vLLM's level 1 holds the weights).
fn remeasure(entry: &ModelEntry, runtimes: &[Arc<dyn Runtime>]) -> Option<crate::host::HostFigure> {
    crate::host::local(&entry.config).then(|| crate::host::measure(runtimes)).flatten()
}

/// The levels every one of `runtimes` can sleep at, lightest first.
fn common_levels(runtimes: &[Arc<dyn Runtime>]) -> Vec<SleepLevel> {
    let Some(first) = runtimes.first() else { return Vec::new() };
    let levels = first.capabilities().sleep_levels.iter().copied();
    levels.filter(|l| runtimes.iter().all(|r| r.capabilities().sleep_levels.contains(l))).collect()
}

impl Manager {
    /// Puts a loaded model to sleep (see the module docs); asleep already changes nothing.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] for a model that is not loaded;
    /// `unsupported` when its engine cannot sleep; [`ManagerError::AdminBusy`]; the
    /// engine's error when it refused (the model serves on as before).
    pub async fn sleep(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        self.to_the_end(name, "sleep", |m, e| async move { m.sleep_entry(&e, None).await }).await
    }

    /// Wakes a sleeping model (see the module docs); awake already (or not loaded) changes
    /// nothing.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::AdminBusy`]; the engine's error when a runtime
    /// could not wake or failed the wake check (the model is then failed, with why).
    pub async fn wake(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        self.to_the_end(name, "wake", |m, e| async move { m.wake_entry(&e).await }).await
    }

    /// Runs `op` on `name`'s entry in the model's admin turn, in a task of its own: it runs
    /// to its end even if the caller goes away (a sleep half done would leave the gate
    /// closed, or runtimes asleep that the model does not know of). Answers the row.
    async fn to_the_end<F>(
        &self,
        name: &str,
        what: &str,
        op: impl FnOnce(Manager, Arc<ModelEntry>) -> F,
    ) -> Result<ModelSnapshot, ManagerError>
    where
        F: std::future::Future<Output = Result<(), ManagerError>> + Send + 'static,
    {
        let entry = self.entry(name)?;
        let admin = self.admin_turn(&entry).await?;
        let run = op(self.clone(), Arc::clone(&entry));
        let run = tokio::spawn(async move {
            let _admin = admin;
            run.await
        });
        run.await.map_err(|_| panicked(what))??;
        Ok(snapshot_of(&entry, &entry.lock()))
    }

    /// Puts `entry` to sleep, its admin turn held by the caller; `for_model`: the model
    /// whose load it makes room for (a demotion), for the event.
    pub(crate) async fn sleep_entry(
        &self,
        entry: &Arc<ModelEntry>,
        for_model: Option<String>,
    ) -> Result<(), ManagerError> {
        let scheduler = {
            let slot = entry.lock();
            let state = slot.lifecycle.state();
            let serving = slot.phase.serving().filter(|_| state == ModelState::Loaded);
            let Some(serving) = serving else { return Err(not_loaded(state, "sleep")) };
            if serving.asleep.is_some() {
                return Ok(());
            }
            serving.scheduler.clone()
        };
        let runtimes = scheduler.runtimes();
        let levels = common_levels(&runtimes);
        if levels.is_empty() {
            let message = format!(
                "model '{}': the {} engine cannot sleep (unload it instead)",
                entry.config.name, entry.config.backend
            );
            return Err(ManagerError::Runtime(RuntimeError::Unsupported { message }));
        }
        let Some(level) = self.sleep_level(entry, &levels) else {
            let message = format!(
                "model '{}': the host has no room for its weights, and its engine sleeps \
                 only by moving them there (unload it instead)",
                entry.config.name
            );
            return Err(ManagerError::Runtime(RuntimeError::Unavailable { message }));
        };
        scheduler.pause();
        scheduler.drained().await;
        let on = crate::place::held_gpus(&entry.lock());
        let before = self.gpu_used_on(entry, &on).await;
        let (name, model_type) = (entry.config.name.as_str(), entry.config.model_type);
        let slept = async {
            let mut reference = Vec::with_capacity(runtimes.len());
            for runtime in &runtimes {
                reference.push(wake_check::ask(runtime.as_ref(), name, model_type).await?);
            }
            for (i, runtime) in runtimes.iter().enumerate() {
                if let Err(e) = runtime.sleep(level).await {
                    for woken in &runtimes[..i] {
                        let _ = woken.wake().await;
                    }
                    return Err(e);
                }
            }
            Ok(reference)
        };
        let reference = match slept.await {
            Ok(reference) => reference,
            Err(e) => {
                self.open_gate(entry);
                return Err(ManagerError::Runtime(e));
            }
        };
        let freed_mib = match (before, self.gpu_used_on(entry, &on).await) {
            (Some(before), Some(after)) => crate::gpu::fell_by(&before, &after),
            _ => 0,
        };
        let since_unix_ms = unix_ms(SystemTime::now());
        let asleep = Asleep { level, since_unix_ms, reference, freed_mib };
        let host = remeasure(entry, &runtimes);
        let (events, model) = (Arc::clone(&self.inner.events), entry.config.name.clone());
        let apply = Apply::new(move |slot| {
            if let Some(serving) = slot.phase.serving_mut() {
                serving.asleep = Some(asleep);
            }
            if host.is_some() {
                slot.host = host;
            }
            if freed_mib > 0 {
                slot.sleep_freed_mib = Some(freed_mib);
            }
            events.journal.record(&model, EventKind::Slept { level, for_model });
        });
        if let Err(stay) =
            self.inner.control.change(entry.position, Change::Sleep { level }, apply).await
        {
            tracing::warn!(model = name, ?stay, "the model left `loaded` while it went to sleep");
            return Err(not_loaded(entry.lock().lifecycle.state(), "sleep"));
        }
        tracing::info!(model = name, level = level.as_str(), freed_mib, "asleep");
        let paused = entry.lock().phase.pause().is_some();
        if scheduler.stats().queue_depth > 0 && !paused {
            self.wake_soon(entry);
        }
        Ok(())
    }

    /// Wakes `entry`, its admin turn held by the caller: in the load lane, the memory its
    /// sleep gave back granted first (under a `vram_budget`, least recently used idle
    /// models make room, as for a reload; refused, the model sleeps on).
    pub(crate) async fn wake_entry(&self, entry: &Arc<ModelEntry>) -> Result<(), ManagerError> {
        let freed_mib = {
            let slot = entry.lock();
            let Some(asleep) = slot.phase.serving().and_then(|s| s.asleep.as_ref()) else {
                return Ok(());
            };
            asleep.freed_mib
        };
        let started = std::time::Instant::now();
        let _lane = self.enter_lane(entry).await;
        self.room_to_wake(entry, freed_mib)
            .await
            .map_err(|r| r.into_error(entry.config.name.as_str()))?;
        let (scheduler, reference, generation) = {
            let slot = entry.lock();
            let Some(serving) = slot.phase.serving() else { return Ok(()) };
            let Some(asleep) = &serving.asleep else { return Ok(()) };
            (serving.scheduler.clone(), asleep.reference.clone(), slot.generation)
        };
        let (name, model_type) = (entry.config.name.as_str(), entry.config.model_type);
        let runtimes = scheduler.runtimes();
        let checked = async {
            for (i, runtime) in runtimes.iter().enumerate() {
                runtime.wake().await.map_err(|e| format!("replica {i} could not wake: {e}"))?;
                let answer = wake_check::ask(runtime.as_ref(), name, model_type)
                    .await
                    .map_err(|e| format!("replica {i} failed the wake check: {e}"))?;
                match reference.get(i) {
                    Some(before) if !answer.agrees(before) => {
                        return Err(format!(
                            "replica {i} answered the wake check with {} after waking, {} before sleeping",
                            answer.brief(),
                            before.brief()
                        ));
                    }
                    _ => {}
                }
            }
            Ok(())
        };
        if let Err(why) = checked.await {
            tracing::error!(model = name, why, "a woken engine failed; model marked failed");
            self.fail_runtimes(entry, generation, format!("woken engine failed: {why}"));
            // Answered once the failure is published: the caller sees the model failed.
            self.inner.control.flush().await;
            return Err(ManagerError::Runtime(RuntimeError::Failed { message: why }));
        }
        let wake_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let host = remeasure(entry, &runtimes);
        let (events, model) = (Arc::clone(&self.inner.events), entry.config.name.clone());
        let apply = Apply::new(move |slot| {
            if host.is_some() {
                slot.host = host;
            }
            if let Some(serving) = slot.phase.serving_mut() {
                serving.asleep = None;
                if serving.pause.is_none() {
                    serving.scheduler.resume();
                }
            }
            // Woken is used: its idle time starts again (else an idle sleep would follow).
            ModelEntry::touch(slot);
            events.journal.record(&model, EventKind::Woke { wake_ms });
        });
        let _ = self.inner.control.change(entry.position, Change::Wake, apply).await;
        tracing::info!(model = name, wake_ms, "awake");
        Ok(())
    }

    /// Makes room for `freed_mib` more on `entry`'s GPUs (what its sleep gave back): the
    /// grant of a second copy (memory only, the model itself held) on its placement.
    async fn room_to_wake(
        &self,
        entry: &Arc<ModelEntry>,
        freed_mib: u64,
    ) -> Result<(), crate::grant::Refusal> {
        if freed_mib == 0 {
            return Ok(());
        }
        let (model, replicas, load_override, on) = {
            let slot = entry.lock();
            let replicas = slot.phase.loaded_replicas().max(1);
            let on = crate::place::held_gpus(&slot);
            (Arc::clone(&slot.effective), replicas, slot.load_override.clone(), on)
        };
        // Idle models may be put to sleep for it, as for a load (`demote.rs`).
        let mut demoted = Vec::new();
        let grant = loop {
            let places = self.places_for(entry, &model, replicas, &load_override).await;
            let places = places.map(|mut places| {
                (places.fit.needed_mib, places.known) = (freed_mib, true);
                if !on.is_empty() {
                    places.fit.split = u32::try_from(on.len()).unwrap_or(u32::MAX);
                    places.fit.allowed = on.clone();
                }
                places
            });
            let ask = crate::control::GrantAsk {
                ask: crate::grant::Ask::SecondCopy,
                loaded: self.loaded_models(false),
                incoming: crate::evict::incoming(entry),
                places,
                host: None,
            };
            if let Some(grant) = self.grant_or_demote(entry, ask, &mut demoted).await? {
                break grant;
            }
        };
        let evicting = !grant.plan.victims.is_empty();
        self.execute(grant.plan, &entry.config.name).await.map_err(crate::grant::Refusal::Held)?;
        if evicting {
            // Taken back only once the victims' memory shows as released: a GPU would
            // refuse it before (and a release that never shows would hold later loads).
            self.wait_for_release(entry).await;
        }
        Ok(())
    }

    /// Wakes `entry` in the background for the requests waiting in its queue (one wake at
    /// a time; it waits for the model's admin turn, behind a sleep in progress).
    pub(crate) fn wake_soon(&self, entry: &Arc<ModelEntry>) {
        if entry.waking.swap(true, Ordering::SeqCst) {
            return;
        }
        let (this, entry) = (self.clone(), Arc::clone(entry));
        tokio::spawn(async move {
            // Held while it wakes: not evicted for the requests' sake.
            let _pin = this.inner.control.pin(&entry);
            loop {
                let turn = this.admin_turn(&entry).await;
                // From here a model that goes back to sleep needs a new wake.
                entry.waking.store(false, Ordering::SeqCst);
                match turn {
                    Ok(_admin) => {
                        if let Err(e) = this.wake_entry(&entry).await {
                            tracing::warn!(model = %entry.config.name, error = %e, "the wake for waiting requests failed");
                            // Still asleep (no room): the waiting requests hear why.
                            let slot = entry.lock();
                            if let Some(serving) =
                                slot.phase.serving().filter(|s| s.asleep.is_some())
                            {
                                let reason =
                                    format!("model '{}' could not wake: {e}", entry.config.name);
                                let why =
                                    hangar_lifecycle::AdmissionError::GenerationAborted { reason };
                                serving.scheduler.cancel_queued(&why);
                            }
                        }
                        return;
                    }
                    Err(_) if entry.lock().phase.serving().is_some_and(|s| s.asleep.is_some()) => {
                        if entry.waking.swap(true, Ordering::SeqCst) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
    }

    /// Opens `entry`'s gate after a sleep that did not happen, unless an operator's pause
    /// holds it.
    fn open_gate(&self, entry: &ModelEntry) {
        let slot = entry.lock();
        if let Some(serving) = slot.phase.serving()
            && serving.pause.is_none()
        {
            serving.scheduler.resume();
        }
    }
}
