//! Request admission: the one call that checks a request against the model's type and
//! capabilities (before any auto-load), then waits for a slot on a replica; and the
//! [`RequestGuard`] that runs the request and reports a crashed runtime.

use std::sync::Arc;

use hangar_backend::{
    EmbedRequest, Embeddings, ForwardRequest, ForwardResponse, GenerateEvent, GenerateRequest,
    GenerateSummary, Prompt, RerankRequest, Rerankings, Role, Runtime, RuntimeError, ThinkingMode,
};
use hangar_config::ModelType;
use hangar_lifecycle::{AdmissionError, ModelState, Permit, admit};
use tokio::sync::mpsc;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::manager::{LoadOptions, Manager};

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
/// request on that replica; a runtime that crashed marks the model failed.
pub struct RequestGuard {
    permit: Permit<dyn Runtime>,
    entry: Arc<ModelEntry>,
    generation: u64,
    manager: Manager,
}

impl RequestGuard {
    /// The replica index the request runs on.
    pub fn replica(&self) -> usize {
        self.permit.replica()
    }

    /// Runs a generation, streaming pieces to `events`. A request without `max_tokens`
    /// gets the model's configured `default_max_tokens`, if any.
    ///
    /// # Errors
    /// The runtime's error; a crash also marks the model failed.
    pub async fn generate(
        &self,
        mut request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, ManagerError> {
        let default = self.entry.config.default_max_tokens.map(std::num::NonZeroU32::get);
        request.params.max_tokens = request.params.max_tokens.or(default);
        let result = self.permit.runtime().generate(request, events).await;
        self.check(result)
    }

    /// Embeds each input.
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, ManagerError> {
        let result = self.permit.runtime().embed(request).await;
        self.check(result)
    }

    /// Scores each document against the query.
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, ManagerError> {
        let result = self.permit.runtime().rerank(request).await;
        self.check(result)
    }

    /// Whether the runtime passes requests through ([`RequestGuard::forward`]).
    pub fn forwards(&self) -> bool {
        self.permit.runtime().forwards()
    }

    /// Passes an OpenAI-compatible request through to the engine. The answer's body
    /// arrives after this returns: keep the guard until it has been read, so the request
    /// stays in flight (and the model cannot be unloaded under it).
    ///
    /// # Errors
    /// As [`RequestGuard::generate`].
    pub async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, ManagerError> {
        let result = self.permit.runtime().forward(request).await;
        self.check(result)
    }

    /// Reports a crash noticed while reading a forwarded answer's body.
    pub fn report(&self, error: &RuntimeError) {
        if let RuntimeError::Crashed { reason } = error {
            self.manager.crashed(&self.entry, self.generation, reason);
        }
    }

    fn check<T>(&self, result: Result<T, RuntimeError>) -> Result<T, ManagerError> {
        if let Err(RuntimeError::Crashed { reason }) = &result {
            self.manager.crashed(&self.entry, self.generation, reason);
        }
        result.map_err(ManagerError::Runtime)
    }
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

/// Holds a model for a request that triggered its auto-load, so it cannot be evicted before
/// the request is admitted.
struct Pin(Arc<ModelEntry>);

impl Pin {
    fn new(entry: &Arc<ModelEntry>) -> Self {
        entry.lock().pins += 1;
        Self(Arc::clone(entry))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.lock().pins -= 1;
        self.0.notify();
    }
}

impl Manager {
    /// Admits a request to a model: checks `work` against the model's type and
    /// capabilities, then waits for a slot on its least-loaded replica. With auto-load on
    /// (globally or for the model), an unloaded or failed model is loaded first, and the
    /// request is guaranteed to run before the model can be evicted.
    ///
    /// # Errors
    /// [`ManagerError::ModelTypeMismatch`], [`ManagerError::ThinkingUnsupported`] and
    /// [`ManagerError::SingleTurn`] before anything is loaded; the spec's admission codes
    /// (`unknown_model`, `model_not_loaded`, `model_loading`, `model_unloading`,
    /// `model_failed`, `queue_full`).
    pub async fn admit(&self, name: &str, work: Work) -> Result<RequestGuard, ManagerError> {
        let entry = self.entry(name)?;
        check_work(&entry, &entry.lock(), work)?;
        let auto = entry.config.auto_load_or(self.inner.auto_load);
        let ready = {
            let mut slot = entry.lock();
            let state = slot.lifecycle.state();
            match state {
                ModelState::Loaded => {
                    ModelEntry::touch(&mut slot);
                    slot.scheduler.clone().map(|s| (s, slot.generation))
                }
                ModelState::Unloaded | ModelState::Failed | ModelState::Loading if auto => None,
                _ => return Err(refusal(&slot).into()),
            }
        };
        let (scheduler, generation, pin) = match ready {
            Some((s, g)) => (s, g, None),
            None => {
                let pin = Pin::new(&entry);
                match self.load(name, LoadOptions::default()).await {
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
                        && slot.scheduler.as_ref().is_some_and(|s| !s.stats().closed));
                if !open {
                    return Err(refusal(&slot).into());
                }
                ModelEntry::touch(&mut slot);
                let scheduler = slot.scheduler.clone().ok_or(AdmissionError::ModelNotLoaded)?;
                (scheduler, slot.generation, Some(pin))
            }
        };
        let permit = scheduler.acquire().await?;
        drop(pin);
        Ok(RequestGuard { permit, entry, generation, manager: self.clone() })
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

/// The admission error of a model that is not serving.
fn refusal(slot: &Slot) -> AdmissionError {
    admit(slot.lifecycle.state(), slot.lifecycle.last_error())
        .err()
        .unwrap_or(AdmissionError::ModelNotLoaded)
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
