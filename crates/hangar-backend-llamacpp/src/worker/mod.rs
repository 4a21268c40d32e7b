//! The worker thread of one replica: it owns the llama.cpp context and samplers (and, for the
//! first replica, loads the weights), and serves commands until its command channel closes.
//! This module owns the thread and the context helpers (decode) the commands share; each kind
//! of work lives in its own module.
//!
//! - `prepare.rs` — a generation's prompt rendered, tokenized and checked against the
//!   context; run by the runtime on a blocking thread before the command is sent, so a huge
//!   prompt never stalls the batch.
//!
//! - `batch.rs` — a generation model's loop: continuous batching of up to `n_seq_max`
//!   sequences in the one context, with prompt reuse.
//! - `generate.rs` — one generation as a sequence of the batch, and `sampling.rs` its sampler
//!   chain; `output.rs` routes the text (stop sequences, tool calls) and `utf8.rs` keeps it
//!   valid UTF-8.
//! - `saved.rs` — prompt caches saved when the loop ends (unload, sleep) and restored when a
//!   new prompt shares more with one of them than with any slot.
//! - `embed.rs` — embeddings and reranking, one input after another.

mod batch;
mod embed;
mod generate;
mod output;
mod prepare;
mod sampling;
mod saved;
mod sleep;
mod utf8;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hangar_backend::{
    EmbedRequest, Embeddings, GenerateEvent, GenerateRequest, GenerateSummary, LoadError,
    ProgressSink, RerankRequest, Rerankings, RuntimeError,
};
use hangar_config::{BackendSettings, LlamaCppSettings, ModelConfig, ModelType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::{mpsc, oneshot};

pub use self::batch::SlotState;
pub(crate) use self::prepare::{PieceBound, Prepared, prepare};
use self::utf8::Utf8Guard;
use crate::prompt::auto::AutoTemplate;
use crate::{RuntimeInfo, capture, settings};

/// A request for the worker, with where its answer goes.
pub(crate) enum Command {
    Generate {
        request: Box<GenerateRequest>,
        /// Its prompt, tokenized before the command was sent.
        prepared: Prepared,
        events: mpsc::Sender<GenerateEvent>,
        reply: oneshot::Sender<Result<GenerateSummary, RuntimeError>>,
    },
    Embed {
        request: EmbedRequest,
        reply: oneshot::Sender<Result<Embeddings, RuntimeError>>,
    },
    Rerank {
        request: RerankRequest,
        reply: oneshot::Sender<Result<Rerankings, RuntimeError>>,
    },
    /// What each sequence slot holds.
    Slots {
        reply: oneshot::Sender<Vec<SlotState>>,
    },
    /// Drop the context, keep the weights, serve nothing until woken.
    Sleep {
        reply: Reply,
    },
    /// Create the context again.
    Wake {
        reply: Reply,
    },
}

/// Everything the worker needs to load its replica.
pub(crate) struct WorkerSpec {
    path: PathBuf,
    settings: LlamaCppSettings,
    model_type: ModelType,
    progress: ProgressSink,
    /// Sequences the context serves at once.
    n_seq: u32,
    /// Generation and batch threads, and why.
    threads: crate::threads::ThreadPlan,
    /// llama.cpp's devices for the load's placement (`crate::devices`); empty: its default.
    devices: Vec<usize>,
    /// Where its prompt caches are saved, and the model's name there; none: not saved.
    saved: Option<(hangar_backend::PromptCacheRoot, String)>,
}

impl WorkerSpec {
    /// `gguf_n_gpu_layers`, which (with the file) determines the loaded weights.
    pub(crate) fn n_gpu_layers(&self) -> Option<i32> {
        self.settings.gguf_n_gpu_layers
    }

    /// The llama.cpp devices the weights go to (with the file and the layers, they
    /// determine the loaded weights); empty: llama.cpp's default.
    pub(crate) fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The same spec on llama.cpp's `devices`.
    pub(crate) fn on_devices(mut self, devices: Vec<usize>) -> Self {
        self.devices = devices;
        self
    }

    /// The same spec saving its prompt caches under `root` (a generation model's only).
    pub(crate) fn saving_under(
        mut self,
        root: Option<hangar_backend::PromptCacheRoot>,
        model: &str,
    ) -> Self {
        self.saved =
            root.filter(|_| self.model_type == ModelType::Llm).map(|r| (r, model.to_owned()));
        self
    }

    /// The spec of a replica of `model` running the `threads` of its plan.
    pub(crate) fn new(
        model: &ModelConfig,
        path: &Path,
        progress: ProgressSink,
        threads: crate::threads::ThreadPlan,
    ) -> Self {
        let settings = match &model.settings {
            BackendSettings::LlamaCpp(s) => s.clone(),
            _ => LlamaCppSettings::default(),
        };
        Self {
            path: path.to_owned(),
            settings,
            model_type: model.model_type,
            progress,
            n_seq: crate::parallel_sequences(model).get(),
            threads,
            devices: Vec::new(),
            saved: None,
        }
    }
}

/// A model's weights, loaded once and shared by the workers of its replicas (read-only after
/// load; llama.cpp supports many contexts on one model), with what is derived from its vocab.
/// Prompts are rendered and tokenized from it off the workers ([`prepare`]).
pub(crate) struct SharedModel {
    pub(crate) model: LlamaModel,
    /// Serializes context creation: `llama_init_from_model` mutates the model.
    new_context: std::sync::Mutex<()>,
    utf8: Utf8Guard,
    /// How much text one token can stand for, for refusing prompts untokenized.
    pub(crate) bound: PieceBound,
    /// How `auto` renders chats: the GGUF's template through Jinja, or llama.cpp's matcher.
    pub(crate) auto: AutoTemplate,
}

/// What a worker reports once its replica is ready: llama.cpp's facts and the weights it
/// serves from (to share with the model's next replica).
pub(crate) type Ready = Result<(RuntimeInfo, Arc<SharedModel>), LoadError>;

/// Loads the GGUF on this thread, reporting llama.cpp's progress.
fn load_model(llama: &LlamaBackend, spec: &WorkerSpec) -> Result<Arc<SharedModel>, LoadError> {
    let progress = spec.progress.clone();
    let model_params = settings::model_params(
        &spec.settings,
        &spec.devices,
        LlamaModelParams::default().with_progress_callback(move |p| {
            progress.report(p);
            true
        }),
    )?;
    let (loaded, errors) =
        capture::errors_during(|| LlamaModel::load_from_file(llama, &spec.path, &model_params));
    match loaded {
        Ok(model) => {
            let utf8 = Utf8Guard::new(&model);
            let bound = PieceBound::new(&model);
            let new_context = std::sync::Mutex::new(());
            let auto = AutoTemplate::new(&model);
            Ok(Arc::new(SharedModel { model, new_context, utf8, bound, auto }))
        }
        Err(e) => {
            let message = if errors.is_empty() { e.to_string() } else { errors.join("; ") };
            Err(LoadError::Failed { message })
        }
    }
}

/// The worker's body: load the weights (unless another replica shares them), create the
/// context, report readiness, serve until the channel closes, drop all. Asked to sleep, it
/// drops the context (KV cache, compute buffers) and keeps the weights until asked to wake,
/// when it creates the context again (`sleep.rs`).
pub(crate) fn run(
    llama: &LlamaBackend,
    spec: WorkerSpec,
    shared: Option<Arc<SharedModel>>,
    ready: oneshot::Sender<Ready>,
    mut commands: mpsc::Receiver<Command>,
) {
    let shared = match shared {
        Some(shared) => shared,
        None => match load_model(llama, &spec) {
            Ok(shared) => shared,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        },
    };
    let mut up = Up::Load(ready);
    loop {
        let worker = match Worker::new(llama, &shared, &spec) {
            Ok(worker) => worker,
            Err(message) => {
                let Up::Wake(reply) = up else {
                    let _ = up.answer_load(Err(LoadError::Failed { message }));
                    return;
                };
                // Still asleep: the context's memory could not be had back.
                let _ = reply.send(Err(failed(message)));
                match sleep::asleep(&mut commands) {
                    Some(reply) => up = Up::Wake(reply),
                    None => return,
                }
                continue;
            }
        };
        match up {
            Up::Load(ready) => {
                if ready.send(Ok((worker.info(), Arc::clone(&shared)))).is_err() {
                    return; // the load was abandoned
                }
            }
            Up::Wake(reply) => {
                let _ = reply.send(Ok(()));
            }
        }
        let slept = worker.serve_until_sleep(&mut commands);
        // The worker and its context are gone here, on the thread that created them; the
        // weights go when the model's last replica goes.
        let Some(reply) = slept else { return };
        let _ = reply.send(Ok(()));
        match sleep::asleep(&mut commands) {
            Some(reply) => up = Up::Wake(reply),
            None => return,
        }
    }
}

/// Whom a ready context answers: the load, or a wake.
enum Up {
    Load(oneshot::Sender<Ready>),
    Wake(Reply),
}

impl Up {
    /// Answers the load (a wake has no load to answer).
    fn answer_load(self, ready: Ready) -> Result<(), Ready> {
        match self {
            Up::Load(sender) => sender.send(ready),
            Up::Wake(_) => Ok(()),
        }
    }
}

/// Where a sleep or a wake is answered.
pub(crate) type Reply = oneshot::Sender<Result<(), RuntimeError>>;

/// What a ready worker thread owns: its context (on the shared weights) and its settings.
struct Worker<'m> {
    model: &'m LlamaModel,
    context: LlamaContext<'m>,
    spec: &'m WorkerSpec,
    utf8: &'m Utf8Guard,
    /// Sequence slots of the context.
    n_seq: usize,
    /// Sequences seated so far (orders the slots by last use).
    seatings: u64,
    /// A sleep asked for, answered when the worker leaves its loop for it.
    sleep: Option<Reply>,
    /// The threads its context runs.
    threads: u32,
    /// The model's saved prompt caches (`saved.rs`); none when not saved.
    store: Option<hangar_prompt_cache::Store>,
}

fn failed(message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Failed { message: message.to_string() }
}

fn unsupported(call: &str, model_type: ModelType) -> RuntimeError {
    RuntimeError::Unsupported {
        message: format!("llama_cpp: {call} is not supported by a {model_type} model"),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl<'m> Worker<'m> {
    /// A worker on `shared`'s weights with a new context: every sequence gets the
    /// configured context (or the model's training context).
    ///
    /// # Errors
    /// llama.cpp's reason when it cannot create the context.
    fn new(
        llama: &LlamaBackend,
        shared: &'m SharedModel,
        spec: &'m WorkerSpec,
    ) -> Result<Self, String> {
        let model = &shared.model;
        let n_ctx_seq = spec.settings.gguf_n_ctx.unwrap_or_else(|| model.n_ctx_train()).max(1);
        let plan = settings::ContextPlan {
            n_ctx: n_ctx_seq.saturating_mul(spec.n_seq),
            n_seq: spec.n_seq,
            threads: spec.threads.threads.max(1),
        };
        let ctx_params = settings::context_params(&spec.settings, spec.model_type, plan);
        let (context, errors) = {
            let _serialized =
                shared.new_context.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            capture::errors_during(|| model.new_context(llama, ctx_params))
        };
        let context = context.map_err(|e| match errors.is_empty() {
            true => format!("cannot create context: {e}"),
            false => format!("cannot create context: {}", errors.join("; ")),
        })?;
        let n_seq = spec.n_seq as usize;
        let utf8 = &shared.utf8;
        Ok(Self {
            model,
            context,
            spec,
            utf8,
            n_seq,
            seatings: 0,
            sleep: None,
            threads: plan.threads,
            store: saved::open(spec),
        })
    }

    /// What llama.cpp made of the settings.
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            n_ctx: self.context.n_ctx(),
            n_ctx_seq: count(self.n_ctx()),
            n_seq_max: self.spec.n_seq,
            n_batch: self.context.n_batch(),
            n_ctx_train: self.model.n_ctx_train(),
            n_threads: self.threads,
            n_threads_batch: self.threads,
            threads_from: self.spec.threads.from,
            cores_available: self.spec.threads.cores,
        }
    }

    /// Serves until the command channel closes (`None`) or a sleep is asked with nothing
    /// in flight (its reply); the context is dropped on return.
    fn serve_until_sleep(mut self, commands: &mut mpsc::Receiver<Command>) -> Option<Reply> {
        if self.spec.model_type == ModelType::Llm {
            self.serve(commands);
        } else {
            self.serve_one_by_one(commands);
        }
        self.sleep.take()
    }

    /// The context one sequence may use: its share of llama.cpp's, or the configured
    /// `gguf_n_ctx` when that is smaller (llama.cpp pads each sequence's context to a multiple
    /// of 256; the operator's limit is the one requests see).
    fn n_ctx(&self) -> usize {
        let configured = self.spec.settings.gguf_n_ctx.map_or(usize::MAX, |n| n as usize);
        (self.context.n_ctx() as usize / self.n_seq.max(1)).min(configured)
    }

    fn n_batch(&self) -> usize {
        (self.context.n_batch() as usize).max(1)
    }

    /// Decodes `tokens` from position `start` in chunks of `n_batch`, asking for logits of
    /// the last token only (or of all, for pooled embeddings).
    fn decode(
        &mut self,
        tokens: &[LlamaToken],
        start: usize,
        all_logits: bool,
    ) -> Result<(), RuntimeError> {
        let n_batch = self.n_batch();
        let mut batch = LlamaBatch::new(n_batch.min(tokens.len()).max(1), 1);
        for (chunk_index, chunk) in tokens.chunks(n_batch).enumerate() {
            batch.clear();
            let base = start + chunk_index * n_batch;
            for (i, &token) in chunk.iter().enumerate() {
                let pos = base + i;
                let last = pos + 1 == start + tokens.len();
                let pos = i32::try_from(pos).map_err(failed)?;
                batch.add(token, pos, &[0], all_logits || last).map_err(failed)?;
            }
            self.context.decode(&mut batch).map_err(|e| failed(format!("llama_decode: {e}")))?;
        }
        Ok(())
    }
}
