//! Hangar's in-process llama.cpp engine adapter, on top of `llama-cpp-2`.
//!
//! This crate owns the [`LlamaCppBackend`] (a [`Backend`] for `llama_cpp` models) and the
//! runtime of one loaded replica. Architecture invariant: no llama.cpp context or sampler
//! ever leaves its worker thread. Each replica is one dedicated OS thread that owns its
//! context and samplers; the async side talks to it through a bounded command channel and
//! gets readiness through a oneshot. A generation model's replica serves up to its
//! `target_inflight` sequences at once in its one context (continuous batching, with prompt
//! reuse); without `gguf_n_threads` the replicas loaded at once split the cores this process
//! may use ([`threads`]). The weights (`LlamaModel`, read-only once loaded) are
//! loaded by the first replica's worker and shared by the model's other replicas, so `N`
//! replicas cost one copy of the weights plus `N` contexts (KV caches). A generation's prompt
//! is rendered and tokenized from the shared weights on a blocking thread before it is sent to
//! the worker, so a prompt of megabytes never stalls the batch. The llama.cpp backend
//! itself (`LlamaBackend`, global init) is created once by the composition root and passed in
//! as a token; the composition root also routes llama.cpp's log lines into `tracing`
//! ([`LlamaCppBackend::new`] says why). Architecture invariant: this crate installs no
//! process-global hook.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hangar_backend_llamacpp::LlamaCppBackend;
//! use llama_cpp_2::llama_backend::LlamaBackend;
//!
//! // The host (composition root) routes llama.cpp's own log lines into `tracing` and
//! // initialises llama.cpp, once per process.
//! hangar_backend_llamacpp::llama_cpp_2::send_logs_to_tracing(Default::default());
//! let llama = Arc::new(LlamaBackend::init().expect("llama.cpp initialises once per process"));
//! let backend = LlamaCppBackend::new(llama);
//! # let _ = backend;
//! ```

pub mod prompt;

mod capture;
pub mod devices;
mod settings;
mod structured;
pub mod threads;
mod worker;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use async_trait::async_trait;
use hangar_backend::{
    Backend, Capabilities, EmbedRequest, Embeddings, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, LoadRequest, Modality, RerankRequest, Rerankings, Runtime,
    RuntimeDetails, RuntimeError, SleepLevel,
};
use hangar_config::{BackendKind, ModelConfig, ModelType, PromptFormat};
pub use llama_cpp_2;
use llama_cpp_2::llama_backend::LlamaBackend;
use tokio::sync::{mpsc, oneshot};

use crate::threads::{Claim, CoreShare, ThreadPlan, ThreadsFrom};
pub use crate::worker::SlotState;
use crate::worker::{Command, SharedModel, WorkerSpec};

/// Commands that may wait for a replica's worker before senders block.
const COMMAND_QUEUE: usize = 64;

/// Most sequences one context serves at once (llama.cpp's `LLAMA_MAX_SEQ`).
const MAX_SEQUENCES: NonZeroU32 = NonZeroU32::new(256).expect("256 is not zero");

/// What makes two replicas' weights the same: the file, how many layers are offloaded, and
/// to which devices.
type WeightsKey = (PathBuf, Option<i32>, Vec<usize>);

/// The weights some replica has loaded, per [`WeightsKey`]. Each slot's async lock is held
/// while a replica of that key loads, so concurrent replica loads share one copy.
type Weights = Mutex<HashMap<WeightsKey, Arc<tokio::sync::Mutex<Weak<SharedModel>>>>>;

/// The in-process llama.cpp engine. Cheap to clone (clones share loaded weights).
#[derive(Clone)]
pub struct LlamaCppBackend {
    llama: Arc<LlamaBackend>,
    weights: Arc<Weights>,
    cores: CoreShare,
}

impl std::fmt::Debug for LlamaCppBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LlamaCppBackend")
    }
}

impl LlamaCppBackend {
    /// An engine using the process's llama.cpp backend.
    ///
    /// The engine installs no process-global hook. The host should route llama.cpp's own
    /// log lines into `tracing` once, where it initialises llama.cpp
    /// ([`llama_cpp_2::send_logs_to_tracing`]): a failed load's [`LoadError::Failed`] carries
    /// the error lines llama.cpp logged meanwhile ("error loading model: …"), and without the
    /// hook those lines go to stderr and the reason is only `llama-cpp-2`'s bare error.
    pub fn new(llama: Arc<LlamaBackend>) -> Self {
        Self::with_cores(llama, threads::available_cores())
    }

    /// An engine whose replicas split `cores` cores (when their model sets no
    /// `gguf_n_threads`) instead of those [`threads::available_cores`] finds.
    pub fn with_cores(llama: Arc<LlamaBackend>, cores: usize) -> Self {
        Self { llama, weights: Arc::default(), cores: CoreShare::new(cores) }
    }
}

/// Sequences one replica of `model` serves at once: its `target_inflight` for a generation
/// model (at most 256), one for embedding and reranking models.
pub fn parallel_sequences(model: &ModelConfig) -> NonZeroU32 {
    match model.model_type {
        ModelType::Llm => model.target_inflight.min(MAX_SEQUENCES),
        ModelType::Embedding | ModelType::Reranking => NonZeroU32::MIN,
    }
}

/// What a `llama_cpp` model supports, from its config alone: text only, multi-turn and
/// thinking modes per its prompt format ([`prompt::multi_turn`], [`prompt::thinking_modes`]),
/// [`parallel_sequences`] per replica.
pub fn capabilities(model: &ModelConfig) -> Capabilities {
    let format = model.prompt_format.unwrap_or(PromptFormat::Auto);
    Capabilities {
        modalities: vec![Modality::Text],
        multi_turn: prompt::multi_turn(format),
        thinking_modes: prompt::thinking_modes(format),
        max_parallel_sequences: Some(parallel_sequences(model)),
        dispatch_ahead: 0,
        resumable: true,
        sleep_levels: vec![SleepLevel::Context],
    }
}

#[async_trait]
impl Backend for LlamaCppBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::LlamaCpp
    }

    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        capabilities(model)
    }

    /// Checks the GGUF file exists (else [`LoadError::NotFound`]), then starts the replica's
    /// worker thread and waits for it to load the model and create its context.
    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        let runtime: Arc<dyn Runtime> = self.load_replica(request).await?;
        Ok(runtime)
    }
}

impl LlamaCppBackend {
    /// [`Backend::load`], returning the concrete runtime (whose [`LlamaCppRuntime::info`]
    /// tells what llama.cpp made of the settings).
    ///
    /// # Errors
    /// [`LoadError::NotFound`] when `model_path` is unset or no file is there,
    /// [`LoadError::Failed`] with llama.cpp's reason when it cannot load the file or create
    /// the context.
    pub async fn load_replica(
        &self,
        request: LoadRequest,
    ) -> Result<Arc<LlamaCppRuntime>, LoadError> {
        let model = &request.model;
        if model.backend != BackendKind::LlamaCpp {
            return Err(LoadError::Refused {
                message: format!("llama_cpp backend cannot load a {} model", model.backend),
            });
        }
        let path = model.model_path.clone().ok_or_else(|| LoadError::NotFound {
            path: model.name.to_string(),
            message: "model_path is not set".to_owned(),
        })?;
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(LoadError::NotFound { path, message: "not a file".to_owned() });
            }
            Err(e) => return Err(LoadError::NotFound { path, message: e.to_string() }),
        }
        request.progress.report(0.0);
        let cores = u32::try_from(self.cores.cores()).unwrap_or(u32::MAX);
        let (plan, claim) = match settings_threads(model) {
            Some(threads) => (ThreadPlan { threads, from: ThreadsFrom::GgufNThreads, cores }, None),
            None => {
                let (threads, claim) = self.cores.claim(&model.name, request.replicas);
                let threads = u32::try_from(threads).unwrap_or(u32::MAX);
                (ThreadPlan { threads, from: ThreadsFrom::CoreShare, cores }, Some(claim))
            }
        };
        let devices = devices::for_placement(&request.gpus)?;
        let spec = WorkerSpec::new(model, Path::new(&path), request.progress.clone(), plan)
            .on_devices(devices)
            .saving_under(request.prompt_cache.clone(), model.name.as_str());
        let key = (PathBuf::from(&path), spec.n_gpu_layers(), spec.devices().to_vec());
        let slot = {
            let mut weights =
                self.weights.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Forget the weights no replica holds any more (slots not being loaded right now).
            weights.retain(|_, slot| slot.try_lock().map_or(true, |w| w.strong_count() > 0));
            Arc::clone(weights.entry(key).or_default())
        };
        let mut slot = slot.lock().await;
        let shared = slot.upgrade();
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let (ready_tx, ready_rx) = oneshot::channel();
        let llama = Arc::clone(&self.llama);
        let thread = std::thread::Builder::new()
            .name(format!("llama-{}-{}", model.name, request.replica))
            .spawn(move || worker::run(&llama, spec, shared, ready_tx, receiver))
            .map_err(|e| LoadError::Refused { message: format!("cannot spawn worker: {e}") })?;
        let (info, weights) = match ready_rx.await {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(LoadError::Failed {
                    message: "llama.cpp worker thread died while loading".to_owned(),
                });
            }
        };
        *slot = Arc::downgrade(&weights);
        drop(slot);
        request.progress.report(1.0);
        tracing::info!(
            model = %model.name,
            replica = request.replica,
            n_ctx = info.n_ctx,
            n_ctx_seq = info.n_ctx_seq,
            n_seq_max = info.n_seq_max,
            n_threads = info.n_threads,
            n_threads_batch = info.n_threads_batch,
            cores = info.cores_available,
            threads_from = ?info.threads_from,
            "llama.cpp model loaded"
        );
        Ok(Arc::new(LlamaCppRuntime {
            capabilities: capabilities(model),
            prompt_format: model.prompt_format.unwrap_or(PromptFormat::Auto),
            info,
            claim: Mutex::new(claim),
            weights: Arc::downgrade(&weights),
            commands: Mutex::new(Some(commands)),
            thread: Mutex::new(Some(thread)),
        }))
    }
}

/// `gguf_n_threads` when the model sets it.
fn settings_threads(model: &ModelConfig) -> Option<u32> {
    match &model.settings {
        hangar_config::BackendSettings::LlamaCpp(s) => s.gguf_n_threads,
        _ => None,
    }
}

/// Facts about a loaded replica, as llama.cpp reports them: its [`Runtime::details`] (the
/// admin row's `runtime_details`) are these fields by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeInfo {
    /// The context size of all sequences together, in tokens (`llama_n_ctx`).
    pub n_ctx: u32,
    /// The context one sequence may use (`gguf_n_ctx`, else its share of `n_ctx`).
    pub n_ctx_seq: u32,
    /// Sequences the context serves at once (continuous batching).
    pub n_seq_max: u32,
    /// The logical batch size (`llama_n_batch`): tokens one decode step holds.
    pub n_batch: u32,
    /// The model's training context.
    pub n_ctx_train: u32,
    /// Generation threads.
    pub n_threads: u32,
    /// Prompt (batch) threads.
    pub n_threads_batch: u32,
    /// Where the thread counts came from.
    pub threads_from: ThreadsFrom,
    /// The cores this process may use ([`threads::available_cores`]).
    pub cores_available: u32,
}

/// One loaded replica: a handle to its worker thread.
pub struct LlamaCppRuntime {
    capabilities: Capabilities,
    /// How chat prompts are rendered.
    prompt_format: PromptFormat,
    info: RuntimeInfo,
    /// This replica's share of the cores, returned at unload.
    claim: Mutex<Option<Claim>>,
    /// The weights this replica serves from (its worker holds them).
    weights: Weak<SharedModel>,
    commands: Mutex<Option<mpsc::Sender<Command>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for LlamaCppRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaCppRuntime").field("info", &self.info).finish_non_exhaustive()
    }
}

fn worker_gone() -> RuntimeError {
    RuntimeError::Crashed { reason: "llama.cpp worker thread is gone".to_owned() }
}

impl LlamaCppRuntime {
    /// What llama.cpp reported when this replica loaded.
    pub fn info(&self) -> RuntimeInfo {
        self.info
    }

    /// What each sequence slot of the context holds (a generation model's; empty for
    /// embedding and reranking models).
    ///
    /// # Errors
    /// [`RuntimeError::Crashed`] when the worker is gone.
    pub async fn slots(&self) -> Result<Vec<SlotState>, RuntimeError> {
        let tx = self.sender()?;
        let (reply, answer) = oneshot::channel();
        tx.send(Command::Slots { reply }).await.map_err(|_| worker_gone())?;
        answer.await.map_err(|_| worker_gone())
    }

    /// Whether this replica and `other` serve from one copy of the weights.
    pub fn shares_weights_with(&self, other: &Self) -> bool {
        self.weights.strong_count() > 0 && Weak::ptr_eq(&self.weights, &other.weights)
    }

    fn sender(&self) -> Result<mpsc::Sender<Command>, RuntimeError> {
        let guard = self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match guard.as_ref() {
            Some(tx) if !tx.is_closed() => Ok(tx.clone()),
            Some(_) => Err(worker_gone()),
            None => Err(RuntimeError::Failed { message: "runtime is unloaded".to_owned() }),
        }
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, RuntimeError>>) -> Command,
    ) -> Result<T, RuntimeError> {
        let tx = self.sender()?;
        let (reply, answer) = oneshot::channel();
        tx.send(make(reply)).await.map_err(|_| worker_gone())?;
        answer.await.map_err(|_| worker_gone())?
    }
}

#[async_trait]
impl Runtime for LlamaCppRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Threads (and where their count came from), sequences and context sizes, and how
    /// `auto` renders chats (`chat_template`: `jinja`, or `llama.cpp built-in` with
    /// `chat_template_fallback` saying why).
    fn details(&self) -> RuntimeDetails {
        let mut details = match serde_json::to_value(self.info) {
            Ok(serde_json::Value::Object(details)) => details,
            _ => RuntimeDetails::new(),
        };
        if let (PromptFormat::Auto, Some(shared)) = (self.prompt_format, self.weights.upgrade()) {
            details.extend(shared.auto.details());
        }
        details
    }

    /// Renders and tokenizes the prompt on a blocking thread (never on the worker, whose batch
    /// would wait for it), then sends the tokens to the worker.
    async fn generate(
        &self,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        self.sender()?;
        let shared = self.weights.upgrade().ok_or_else(worker_gone)?;
        let (format, n_ctx) = (self.prompt_format, self.info.n_ctx_seq as usize);
        let (request, prepared) = tokio::task::spawn_blocking(move || {
            let prepared = worker::prepare(&shared, format, n_ctx, &request);
            (request, prepared)
        })
        .await
        .map_err(|e| RuntimeError::Failed { message: format!("prompt preparation failed: {e}") })?;
        let prepared = prepared?;
        self.call(|reply| Command::Generate { request: Box::new(request), prepared, events, reply })
            .await
    }

    /// The generation's own preparation (template, tokenizer, context check), on a blocking
    /// thread as for [`Runtime::generate`]; the worker decodes nothing.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u32, RuntimeError> {
        self.sender()?;
        let shared = self.weights.upgrade().ok_or_else(worker_gone)?;
        let (format, n_ctx) = (self.prompt_format, self.info.n_ctx_seq as usize);
        let prepared =
            tokio::task::spawn_blocking(move || worker::prepare(&shared, format, n_ctx, &request))
                .await
                .map_err(|e| RuntimeError::Failed {
                    message: format!("prompt preparation failed: {e}"),
                })??;
        Ok(u32::try_from(prepared.own_prompt_tokens()).unwrap_or(u32::MAX))
    }

    async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        self.call(|reply| Command::Embed { request, reply }).await
    }

    async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, RuntimeError> {
        self.call(|reply| Command::Rerank { request, reply }).await
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        self.sender().map(drop)
    }

    /// Drops the replica's context (KV cache, compute buffers, its prompt cache) and keeps
    /// the weights where they were loaded: llama.cpp cannot move offloaded weights back to
    /// the host, so the only level is [`SleepLevel::Context`].
    async fn sleep(&self, level: SleepLevel) -> Result<(), RuntimeError> {
        if level != SleepLevel::Context {
            return Err(RuntimeError::Unsupported {
                message: format!(
                    "llama_cpp sleeps at level context only, not {}: llama.cpp cannot move loaded weights to host memory",
                    level.as_str()
                ),
            });
        }
        self.call(|reply| Command::Sleep { reply }).await
    }

    /// Creates the replica's context again.
    async fn wake(&self) -> Result<(), RuntimeError> {
        self.call(|reply| Command::Wake { reply }).await
    }

    /// Closes the command channel, so the worker finishes what it has queued, drops
    /// context and model, and exits; then joins it.
    async fn unload(&self) {
        let commands =
            self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        drop(commands);
        let thread = self.thread.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::warn!("llama.cpp worker thread panicked");
            }
        }
        drop(self.claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}
