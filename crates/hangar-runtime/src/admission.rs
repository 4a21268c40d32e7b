//! Request admission: the one call that checks a request against the model's type and
//! capabilities (before any auto-load), then waits for a slot on a replica; and the
//! [`RequestGuard`] that runs the request and reports a crashed runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hangar_backend::{
    EmbedRequest, Embeddings, ForwardRequest, ForwardResponse, GenerateEvent, GenerateRequest,
    GenerateSummary, Prompt, RerankRequest, Rerankings, Role, Runtime, RuntimeError, ThinkingMode,
};
use hangar_config::ModelType;
use hangar_lifecycle::{AdmissionError, ModelState, Permit, Scheduler, admit};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::manager::Manager;
use crate::pause::{Action, Interrupt, aborted, in_service, next_action, on_grant};

/// What a request asks of a model. [`Manager::admit`] checks it against the model's type
/// and capabilities before anything else, so a request the model cannot serve is refused
/// without loading (or evicting) anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Text generation (chat, completion, response).
    Generate {
        /// The request-level thinking mode.
        thinking: ThinkingMode,
        /// User messages in the prompt (a raw prompt counts as one).
        user_turns: usize,
    },
    /// Embeddings.
    Embed,
    /// Reranking.
    Rerank,
}

impl Work {
    /// The work of a generation request.
    pub fn generation(request: &GenerateRequest) -> Self {
        let user_turns = match &request.prompt {
            Prompt::Text(_) => 1,
            Prompt::Chat(messages) => messages.iter().filter(|m| m.role == Role::User).count(),
        };
        Self::Generate { thinking: request.thinking, user_turns }
    }

    /// The model type that does this work.
    pub fn model_type(self) -> ModelType {
        match self {
            Self::Generate { .. } => ModelType::Llm,
            Self::Embed => ModelType::Embedding,
            Self::Rerank => ModelType::Reranking,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Generate { .. } => "text generation",
            Self::Embed => "embeddings",
            Self::Rerank => "reranking",
        }
    }
}

/// An admitted request: holds one in-flight slot on one replica until dropped. Runs the
/// request on that replica; a runtime that crashed marks the model failed. It watches the
/// model's pauses: an `abort` ends it with `generation_aborted`, a `retract` puts a running
/// generation back at the head of the queue and resumes it afterwards. (A request still on a
/// reload's previous runtimes runs to its end: pauses are for the runtimes in service.)
/// With `limits.request_timeout_s` set, a request still running that long after it got its
/// slot is cancelled and ends with `deadline_exceeded`.
pub struct RequestGuard {
    /// The slot; `None` only while a retracted generation waits for a new one.
    permit: Mutex<Option<Permit<dyn Runtime>>>,
    /// The scheduler the slot came from; a retracted request can move to a reload's new one.
    scheduler: Mutex<Scheduler<dyn Runtime>>,
    interrupts: watch::Receiver<Interrupt>,
    entry: Arc<ModelEntry>,
    generation: AtomicU64,
    manager: Manager,
    /// When the request is cancelled (`limits.request_timeout_s` after its slot was granted).
    deadline: Option<Instant>,
}

/// Pieces a retractable generation buffers between its engine and its client.
const RELAY_BUFFER: usize = 32;

impl RequestGuard {
    fn runtime(&self) -> Result<Arc<dyn Runtime>, ManagerError> {
        let permit = lock(&self.permit);
        let permit = permit.as_ref().ok_or(AdmissionError::ModelUnloading)?;
        Ok(Arc::clone(permit.runtime()))
    }

    /// The replica index the request runs on (`None` while a retracted generation waits
    /// for its slot back).
    pub fn replica(&self) -> Option<usize> {
        lock(&self.permit).as_ref().map(Permit::replica)
    }

    /// Runs a generation, streaming pieces to `events`. A request without `max_tokens`
    /// gets the model's configured `default_max_tokens`, if any.
    ///
    /// # Errors
    /// The runtime's error (a crash also marks the model failed); `generation_aborted` when
    /// an operator aborted it; `deadline_exceeded` when it ran past the request deadline
    /// (the engine's generation is dropped, which cancels it); the admission code of a
    /// retracted generation that could not get its slot back (the model was unloaded
    /// meanwhile).
    pub async fn generate(
        &self,
        mut request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, ManagerError> {
        let default = self.entry.config.default_max_tokens.map(std::num::NonZeroU32::get);
        request.params.max_tokens = request.params.max_tokens.or(default);
        let mut interrupts = self.interrupts.clone();
        let mut produced = String::new();
        loop {
            let runtime = self.runtime()?;
            // Only a generation its engine can resume is relayed (to record what the client
            // got); any other one runs to its end through a retract.
            let resumable = runtime.capabilities().resumable
                && request.tools.is_none()
                && request.format.is_none();
            let (tx, mut relay) = mpsc::channel(if resumable { RELAY_BUFFER } else { 1 });
            let sink = if resumable { tx } else { events.clone() };
            // Boxed (as the trait returns it), so that a retract can drop it: that ends the
            // engine's generation before the request waits for a slot again.
            let mut run = runtime.generate(request.clone(), sink);
            let action = loop {
                tokio::select! {
                    result = &mut run => {
                        while let Ok(event) = relay.try_recv() {
                            if events.send(event).await.is_err() {
                                return Err(ManagerError::Runtime(RuntimeError::Cancelled));
                            }
                        }
                        return self.check(result).await;
                    }
                    Some(event) = relay.recv(), if resumable => {
                        if let GenerateEvent::Text(text) = &event {
                            produced.push_str(text);
                        }
                        if events.send(event).await.is_err() {
                            return Err(ManagerError::Runtime(RuntimeError::Cancelled));
                        }
                    }
                    action = next_action(&mut interrupts) => match action {
                        Action::Retract if !resumable => {}
                        _ if !self.in_service() => {}
                        action => break action,
                    },
                    // Returning drops `run`: the engine stops generating.
                    error = self.expired() => return Err(error),
                }
            };
            match action {
                Action::Abort(reason) => return Err(aborted(&reason)),
                Action::Retract => {
                    // Stop the engine's generation, give the slot back, wait at the head of
                    // the queue, then go on from what the client already has.
                    drop((run, relay));
                    tokio::select! {
                        requeued = self.requeue(&mut interrupts) => requeued?,
                        error = self.expired() => return Err(error),
                    }
                    request.resume = Some(produced.clone());
                }
            }
        }
    }

    /// Embeds each input.
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, ManagerError> {
        let runtime = self.runtime()?;
        let result = self.unless_aborted(runtime.embed(request)).await?;
        self.check(result).await
    }

    /// The prompt tokens a generation of `request` would read, nothing generated
    /// ([`Runtime::count_tokens`](crate::engine::Runtime::count_tokens)).
    ///
    /// # Errors
    /// As [`RequestGuard::generate`]; `unsupported` for an engine that cannot count.
    pub async fn count_tokens(&self, request: GenerateRequest) -> Result<u32, ManagerError> {
        let runtime = self.runtime()?;
        let result = self.unless_aborted(runtime.count_tokens(request)).await?;
        self.check(result).await
    }

    /// Scores each document against the query.
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, ManagerError> {
        let runtime = self.runtime()?;
        let result = self.unless_aborted(runtime.rerank(request)).await?;
        self.check(result).await
    }

    /// Whether the runtime passes requests through ([`RequestGuard::forward`]).
    pub fn forwards(&self) -> bool {
        self.runtime().is_ok_and(|r| r.forwards())
    }

    /// Passes an OpenAI-compatible request through to the engine. The answer's body
    /// arrives after this returns: keep the guard until it has been read, so the request
    /// stays in flight (and the model cannot be unloaded under it), and stop reading when
    /// [`RequestGuard::aborted`] resolves.
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, ManagerError> {
        let runtime = self.runtime()?;
        let result = self.unless_aborted(runtime.forward(request)).await?;
        self.check(result).await
    }

    /// Resolves with `generation_aborted` when an operator aborts this request (a pause with
    /// mode `abort`), or with `deadline_exceeded` when it runs past the request deadline;
    /// never otherwise. A forwarded answer is cut when it does.
    pub async fn aborted(&self) -> ManagerError {
        tokio::select! {
            error = self.operator_abort() => error,
            error = self.expired() => error,
        }
    }

    /// Resolves with `deadline_exceeded` once the request's deadline has passed; never
    /// without one.
    async fn expired(&self) -> ManagerError {
        match self.deadline {
            Some(deadline) => {
                tokio::time::sleep_until(deadline).await;
                ManagerError::DeadlineExceeded {
                    model: self.entry.config.name.to_string(),
                    timeout: self.manager.inner.request_timeout.unwrap_or_default(),
                }
            }
            None => std::future::pending().await,
        }
    }

    /// Resolves with `generation_aborted` when an operator aborts this request.
    async fn operator_abort(&self) -> ManagerError {
        let mut interrupts = self.interrupts.clone();
        loop {
            if let Action::Abort(reason) = next_action(&mut interrupts).await
                && self.in_service()
            {
                return aborted(&reason);
            }
        }
    }

    /// Whether the request runs on the runtimes in service, whose pauses it obeys; a
    /// request still running on a reload's previous runtimes runs to its end.
    fn in_service(&self) -> bool {
        let scheduler = lock(&self.scheduler).clone();
        in_service(&self.entry.lock(), &scheduler)
    }

    /// Reports a crash noticed while reading a forwarded answer's body; returns once the
    /// model's row shows it (its failures included), so this request's client and the
    /// next reader see the same model.
    pub async fn report(&self, error: &RuntimeError) {
        if let RuntimeError::Crashed { reason } = error {
            let generation = self.generation.load(Ordering::Relaxed);
            self.manager.crashed(&self.entry, generation, reason);
            self.manager.inner.control.flush().await;
        }
    }

    /// Runs `work` unless an abort or the deadline comes first (dropping `work` cancels it).
    async fn unless_aborted<T>(
        &self,
        work: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<Result<T, RuntimeError>, ManagerError> {
        tokio::select! {
            result = work => Ok(result),
            error = self.aborted() => Err(error),
        }
    }

    /// Gives the slot back and takes one again from the head of the queue.
    async fn requeue(
        &self,
        interrupts: &mut watch::Receiver<Interrupt>,
    ) -> Result<(), ManagerError> {
        // The old permit is dropped (its slot freed) before waiting for a new one.
        let old = lock(&self.permit).take();
        drop(old);
        let scheduler = lock(&self.scheduler).clone();
        let (permit, scheduler) = grant(&self.entry, scheduler, interrupts, true).await?;
        *lock(&self.scheduler) = scheduler;
        self.generation.store(self.entry.lock().generation, Ordering::Relaxed);
        *lock(&self.permit) = Some(permit);
        Ok(())
    }

    async fn check<T>(&self, result: Result<T, RuntimeError>) -> Result<T, ManagerError> {
        if let Err(error) = &result {
            self.report(error).await;
        }
        result.map_err(ManagerError::Runtime)
    }
}

/// Takes a slot from `scheduler` (at the head of the queue when `front`), then applies a
/// pause that began before the request could see its interrupt: `abort` ends it, `retract`
/// sends it back to the head of the queue. A request still queued when a reload closes the
/// previous runtimes' scheduler moves to the new one, at the head of its queue. Returns the
/// slot and the scheduler it came from.
async fn grant(
    entry: &ModelEntry,
    mut scheduler: Scheduler<dyn Runtime>,
    interrupts: &mut watch::Receiver<Interrupt>,
    mut front: bool,
) -> Result<(Permit<dyn Runtime>, Scheduler<dyn Runtime>), ManagerError> {
    loop {
        let acquired =
            if front { scheduler.acquire_front().await } else { scheduler.acquire().await };
        let permit = match acquired {
            Ok(permit) => permit,
            Err(AdmissionError::ModelUnloading) => match successor(entry, &scheduler) {
                Some(next) => {
                    (scheduler, front) = (next, true);
                    continue;
                }
                None => return Err(AdmissionError::ModelUnloading.into()),
            },
            Err(e) => return Err(e.into()),
        };
        interrupts.borrow_and_update();
        match on_grant(&entry.lock(), &scheduler) {
            None => return Ok((permit, scheduler)),
            Some(Action::Abort(reason)) => return Err(aborted(&reason)),
            Some(Action::Retract) => front = true,
        }
    }
}

/// The scheduler that replaced `closed` while the model stayed loaded (a reload's), if any.
fn successor(
    entry: &ModelEntry,
    closed: &Scheduler<dyn Runtime>,
) -> Option<Scheduler<dyn Runtime>> {
    let slot = entry.lock();
    if slot.lifecycle.state() != ModelState::Loaded {
        return None;
    }
    slot.phase.scheduler().filter(|s| !s.same(closed)).cloned()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Only ever holds a permit swapped whole: a poisoned lock holds a valid one.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        ModelEntry::touch(&mut self.entry.lock());
    }
}

impl std::fmt::Debug for RequestGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestGuard")
            .field("model", &self.entry.config.name)
            .field("replica", &self.replica())
            .finish()
    }
}

impl Manager {
    /// Admits a request to a model: checks `work` against the model's type and
    /// capabilities, then waits for a slot on its least-loaded replica. With auto-load on
    /// (globally or for the model), an unloaded or failed model is loaded first, and the
    /// request is guaranteed to run before the model can be evicted. A sleeping model is
    /// woken while the request waits in its queue.
    ///
    /// # Errors
    /// [`ManagerError::ModelTypeMismatch`], [`ManagerError::ThinkingUnsupported`] and
    /// [`ManagerError::SingleTurn`] before anything is loaded; the spec's admission codes
    /// (`unknown_model`, `model_not_loaded`, `model_loading`, `model_unloading`,
    /// `model_failed`, `queue_full`).
    pub async fn admit(&self, name: &str, work: Work) -> Result<RequestGuard, ManagerError> {
        // A changed definition waiting for the model's next load takes effect first if the
        // request is to load it.
        let entry = self.current_entry(name).await?;
        check_work(&entry, &entry.lock(), work)?;
        let auto = entry.config.auto_load_or(self.inner.auto_load);
        let (ready, asleep) = {
            let mut slot = entry.lock();
            let state = slot.lifecycle.state();
            let asleep =
                slot.phase.serving().is_some_and(|s| s.asleep.is_some() && s.pause.is_none());
            let ready = match state {
                ModelState::Loaded => {
                    ModelEntry::touch(&mut slot);
                    slot.phase.scheduler().map(|s| (s.clone(), slot.generation))
                }
                ModelState::Unloaded | ModelState::Failed | ModelState::Loading if auto => None,
                _ => return Err(refusal(&entry, &slot)),
            };
            (ready, asleep)
        };
        // A sleeping model: the request waits in its queue while the model wakes (while an
        // operator's pause holds it, the resume wakes it).
        if asleep {
            self.wake_soon(&entry);
        }
        let (scheduler, generation, pin) = match ready {
            Some((s, g)) => (s, g, None),
            None => {
                // Held until the request is admitted, so the model cannot be evicted first.
                let pin = self.inner.control.pin(&entry);
                match self.load_on_demand(name).await {
                    Ok(_) => {}
                    Err(ManagerError::LoadFailed { snapshot, .. }) => {
                        let last_error = snapshot.last_error.unwrap_or_default();
                        return Err(AdmissionError::ModelFailed { last_error }.into());
                    }
                    Err(ManagerError::Conflict { state: ModelState::Unloading, .. }) => {
                        return Err(AdmissionError::ModelUnloading.into());
                    }
                    Err(e) => return Err(e),
                }
                let mut slot = entry.lock();
                let state = slot.lifecycle.state();
                // A pinned request may still enter while an eviction waits for its pins.
                let open = state == ModelState::Loaded
                    || (state == ModelState::Unloading
                        && slot.phase.scheduler().is_some_and(|s| !s.stats().closed));
                if !open {
                    return Err(refusal(&entry, &slot));
                }
                ModelEntry::touch(&mut slot);
                let scheduler =
                    slot.phase.scheduler().cloned().ok_or(AdmissionError::ModelNotLoaded)?;
                (scheduler, slot.generation, Some(pin))
            }
        };
        let mut interrupts = entry.interrupts.subscribe();
        let (permit, granted) = grant(&entry, scheduler.clone(), &mut interrupts, false).await?;
        // Moved to a reload's new runtimes: crash reports are about their generation.
        let generation =
            if granted.same(&scheduler) { generation } else { entry.lock().generation };
        let scheduler = granted;
        drop(pin);
        Ok(RequestGuard {
            permit: Mutex::new(Some(permit)),
            scheduler: Mutex::new(scheduler),
            interrupts,
            entry,
            generation: AtomicU64::new(generation),
            manager: self.clone(),
            deadline: self.inner.request_timeout.map(|timeout| Instant::now() + timeout),
        })
    }

    /// Admits and runs a generation, streaming pieces to `events`.
    ///
    /// # Errors
    /// As [`Manager::admit`] and [`RequestGuard::generate`].
    pub async fn generate(
        &self,
        name: &str,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, ManagerError> {
        let guard = self.admit(name, Work::generation(&request)).await?;
        guard.generate(request, events).await
    }

    /// Admits and runs an embedding request.
    ///
    /// # Errors
    /// As [`Manager::admit`] and [`RequestGuard::embed`].
    pub async fn embed(
        &self,
        name: &str,
        request: EmbedRequest,
    ) -> Result<Embeddings, ManagerError> {
        self.admit(name, Work::Embed).await?.embed(request).await
    }

    /// Admits and runs a rerank request.
    ///
    /// # Errors
    /// As [`Manager::admit`] and [`RequestGuard::rerank`].
    pub async fn rerank(
        &self,
        name: &str,
        request: RerankRequest,
    ) -> Result<Rerankings, ManagerError> {
        self.admit(name, Work::Rerank).await?.rerank(request).await
    }
}

/// The admission error of a model that is not serving: `model_quarantined` while it is
/// quarantined, else the one its state says.
fn refusal(entry: &ModelEntry, slot: &Slot) -> ManagerError {
    if let Some(quarantined) = crate::quarantine::quarantined(entry, slot) {
        return quarantined;
    }
    admit(slot.lifecycle.state(), slot.lifecycle.last_error())
        .err()
        .unwrap_or(AdmissionError::ModelNotLoaded)
        .into()
}

/// Whether the model can do `work` at all: its type, its thinking modes, multi-turn.
fn check_work(entry: &ModelEntry, slot: &Slot, work: Work) -> Result<(), ManagerError> {
    let config = &entry.config;
    let model = || config.name.to_string();
    if config.model_type != work.model_type() {
        return Err(ManagerError::ModelTypeMismatch {
            model: model(),
            model_type: config.model_type,
            work: work.name(),
            needs: work.model_type(),
        });
    }
    if let Work::Generate { thinking, user_turns } = work {
        let caps = &slot.capabilities;
        if thinking != ThinkingMode::Default && !caps.thinking_modes.contains(&thinking) {
            return Err(ManagerError::ThinkingUnsupported {
                model: model(),
                requested: thinking,
                supported: caps.thinking_modes.clone(),
            });
        }
        if !caps.multi_turn && user_turns > 1 {
            return Err(ManagerError::SingleTurn { model: model(), user_turns });
        }
    }
    Ok(())
}
