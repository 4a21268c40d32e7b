//! Hangar's stub engine and its pretend GPU: a deterministic engine for tests and demos.
//!
//! Everything it does comes from the model's `stub` config section ([`StubSettings`]):
//! simulated load, unload and per-token latency (through `tokio::time`, so tests run on
//! paused virtual time), injected load failures ("not found" or any other), and a crash on
//! the N-th request. Replies are derived from a stable hash of the prompt (FNV-1a), so equal
//! prompts always get equal replies, on every platform and in every process.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use hangar_stub::StubBackend;
//! use hangar_backend::{Backend, GenerateRequest, LoadRequest, Prompt, SamplingParams};
//! use hangar_config::{ModelConfig, ModelName};
//!
//! let model = ModelConfig::parse(
//!     &ModelName::new("demo").unwrap(),
//!     &serde_json::json!({ "backend": "stub", "stub": { "reply": "hello there" } }),
//! )
//! .unwrap();
//! let backend = StubBackend::new();
//! let runtime = backend
//!     .load(LoadRequest::new(Arc::new(model), 0, 1))
//!     .await
//!     .unwrap();
//! let (tx, mut rx) = tokio::sync::mpsc::channel(16);
//! let request = GenerateRequest {
//!     prompt: Prompt::Text("hi".into()),
//!     params: SamplingParams::default(),
//!     thinking: Default::default(),
//!     translation: None,
//!     tools: None,
//!     format: None,
//!     resume: None,
//! };
//! let summary = runtime.generate(request, tx).await.unwrap();
//! assert_eq!(summary.completion_tokens, 2);
//! assert!(rx.recv().await.is_some());
//! # });
//! ```

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use hangar_config::{BackendKind, BackendSettings, ModelConfig, ModelType, StubSettings};
use tokio::sync::mpsc;

use hangar_backend::{
    Backend, Capabilities, EmbedRequest, Embeddings, FinishReason, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, LoadRequest, Modality, Prompt, RerankRequest, Rerankings, Runtime,
    RuntimeError, SleepLevel, ThinkingMode,
};

mod gpu;

pub use gpu::StubGpu;

/// Tokens generated when a request sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// The stub's pretend context, in words: prompt and reply together stop there (`Length`),
/// as an engine stops when its context is full, whatever `max_tokens` asks.
pub const CONTEXT_WORDS: u32 = 1024;

/// Dimension of the stub's embedding vectors.
pub const EMBEDDING_DIM: usize = 8;

/// The stub engine. Cheap to clone; clones share their counters.
#[derive(Debug, Clone)]
pub struct StubBackend {
    kind: BackendKind,
    counters: Arc<Counters>,
    gpu: Option<Arc<StubGpu>>,
}

#[derive(Debug, Default)]
struct Counters {
    live: AtomicUsize,
    loads_started: AtomicUsize,
}

impl Default for StubBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl StubBackend {
    /// A stub serving [`BackendKind::Stub`] models.
    pub fn new() -> Self {
        Self::with_kind(BackendKind::Stub)
    }

    /// A stub standing in for another backend kind, so tests can exercise that kind's
    /// overrides and rules without its engine. Models that are not stub models behave as
    /// with `StubSettings::default()` (instant, never failing).
    pub fn with_kind(kind: BackendKind) -> Self {
        Self { kind, counters: Arc::default(), gpu: None }
    }

    /// Replicas take memory on `gpu` while loaded (the footprints it is given).
    pub fn with_gpu(mut self, gpu: Arc<StubGpu>) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Runtimes loaded and not yet unloaded (or dropped).
    pub fn live_runtimes(&self) -> usize {
        self.counters.live.load(Ordering::SeqCst)
    }

    /// Calls of [`Backend::load`] so far, successful or not.
    pub fn loads_started(&self) -> usize {
        self.counters.loads_started.load(Ordering::SeqCst)
    }
}

/// The model's stub settings, or the defaults for models of other backends.
fn stub_settings(model: &ModelConfig) -> StubSettings {
    match &model.settings {
        BackendSettings::Stub(s) => s.clone(),
        _ => StubSettings::default(),
    }
}

fn stub_capabilities(settings: &StubSettings) -> Capabilities {
    let thinking_modes = if settings.thinking == Some(true) {
        vec![ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled]
    } else {
        vec![ThinkingMode::Default]
    };
    Capabilities {
        modalities: vec![Modality::Text],
        multi_turn: true,
        thinking_modes,
        max_parallel_sequences: settings.max_parallel_sequences.and_then(NonZeroU32::new),
        dispatch_ahead: settings.dispatch_ahead.unwrap_or(0),
        resumable: true,
        sleep_levels: if settings.sleeps == Some(true) {
            vec![SleepLevel::Context]
        } else {
            Vec::new()
        },
    }
}

async fn sleep_ms(ms: Option<u64>) {
    if let Some(ms) = ms.filter(|&ms| ms > 0) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

#[async_trait]
impl Backend for StubBackend {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        stub_capabilities(&stub_settings(model))
    }

    /// Reports progress 0, then fails at once when `not_found` is set; otherwise waits
    /// `load_delay_ms`, fails when `fail_load` is set, else reports progress 1 and returns a
    /// [`StubRuntime`].
    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        self.counters.loads_started.fetch_add(1, Ordering::SeqCst);
        let model = &request.model;
        if model.backend != self.kind {
            return Err(LoadError::Refused {
                message: format!(
                    "stub backend for {} cannot load a {} model",
                    self.kind, model.backend
                ),
            });
        }
        let settings = stub_settings(model);
        request.progress.report(0.0);
        if settings.not_found == Some(true) {
            return Err(LoadError::NotFound {
                path: model.model_path.clone().unwrap_or_else(|| model.name.to_string()),
                message: "stub: model file not found".to_owned(),
            });
        }
        sleep_ms(settings.load_delay_ms).await;
        if let Some(message) = settings.fail_load.clone() {
            return Err(LoadError::Failed { message });
        }
        request.progress.report(1.0);
        let mut runtime = StubRuntime::new(model, settings, LiveGuard::new(&self.counters));
        if let Some(gpu) = &self.gpu {
            runtime.gpu = Some((Arc::clone(gpu), gpu.take(model.name.as_str())));
        }
        Ok(Arc::new(runtime))
    }
}

/// Counts a runtime as live until it is unloaded or dropped, exactly once.
#[derive(Debug)]
struct LiveGuard {
    counters: Arc<Counters>,
    released: AtomicBool,
}

impl LiveGuard {
    fn new(counters: &Arc<Counters>) -> Self {
        counters.live.fetch_add(1, Ordering::SeqCst);
        Self { counters: Arc::clone(counters), released: AtomicBool::new(false) }
    }

    fn release(&self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.counters.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.release();
    }
}

/// A loaded stub replica. Serves by the model's type: `llm` models generate, `embedding`
/// models embed, `reranking` models rerank; any other call is
/// [`RuntimeError::Unsupported`].
#[derive(Debug)]
pub struct StubRuntime {
    model_type: ModelType,
    settings: StubSettings,
    capabilities: Capabilities,
    /// Requests served so far (supported calls only), for `crash_after_requests`.
    requests: AtomicU64,
    /// Set once the injected crash happened; every later call fails with it.
    crashed: OnceLock<String>,
    live: LiveGuard,
    /// The pretend GPU and the memory this replica holds on it.
    gpu: Option<(Arc<StubGpu>, u64)>,
    /// Asleep: its pretend GPU memory given back, serving nothing.
    asleep: AtomicBool,
    /// Woken at least once (for `reply_after_wake`).
    woken: AtomicBool,
}

impl StubRuntime {
    fn new(model: &ModelConfig, settings: StubSettings, live: LiveGuard) -> Self {
        Self {
            model_type: model.model_type,
            capabilities: stub_capabilities(&settings),
            settings,
            requests: AtomicU64::new(0),
            crashed: OnceLock::new(),
            live,
            gpu: None,
            asleep: AtomicBool::new(false),
            woken: AtomicBool::new(false),
        }
    }

    fn crash_error(&self) -> Option<RuntimeError> {
        self.crashed.get().map(|reason| RuntimeError::Crashed { reason: reason.clone() })
    }

    /// Admits one request of type `wanted`: fails when the runtime has crashed, when the
    /// model does not serve `wanted` (not counted), or when this is the request that crashes.
    fn admit(&self, wanted: ModelType, call: &str) -> Result<(), RuntimeError> {
        if let Some(e) = self.crash_error() {
            return Err(e);
        }
        if self.asleep.load(Ordering::SeqCst) {
            return Err(RuntimeError::Failed { message: format!("stub: {call} while asleep") });
        }
        if self.model_type != wanted {
            return Err(RuntimeError::Unsupported {
                message: format!("stub: {call} is not supported by a {} model", self.model_type),
            });
        }
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        if self.settings.crash_after_requests == Some(n) {
            let reason = format!("stub: injected crash on request {n}");
            let reason = self.crashed.get_or_init(|| reason).clone();
            return Err(RuntimeError::Crashed { reason });
        }
        Ok(())
    }
}

#[async_trait]
impl Runtime for StubRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Emits one word per token, each after `token_latency_ms`: the configured `reply`, or
    /// an endless stream of words derived from the prompt's hash. Stops before `max_tokens` (default
    /// [`DEFAULT_MAX_TOKENS`]) is exceeded or the context ([`CONTEXT_WORDS`]) is full
    /// (`Length`), before a word that would complete a stop sequence, or at the reply's end
    /// (`Stop`).
    async fn generate(
        &self,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        if let Some(e) = self.crash_error() {
            return Err(e);
        }
        if let Err(e) = self.admit(ModelType::Llm, "generate") {
            // The injected crash happens while serving: after the first word is out.
            if let RuntimeError::Crashed { .. } = &e {
                let prompt = prompt_text(&request.prompt);
                let first = match &self.settings.reply {
                    Some(reply) => reply.split_whitespace().next().map(str::to_owned),
                    None => derived_reply(&prompt).next(),
                };
                if let Some(word) = first {
                    let _ = events.send(GenerateEvent::Text(word)).await;
                }
            }
            return Err(e);
        }
        // Constrained decoding is an engine feature; the stub has no decoder to constrain.
        if request.tools.is_some() || request.format.is_some() {
            return Err(RuntimeError::Unsupported {
                message:
                    "stub: tools and response_format need a real engine (constrained decoding)"
                        .to_owned(),
            });
        }
        let prompt = prompt_text(&request.prompt);
        let woken_wrong =
            self.settings.reply_after_wake.as_ref().filter(|_| self.woken.load(Ordering::SeqCst));
        let words: Box<dyn Iterator<Item = String> + Send> =
            match woken_wrong.or(self.settings.reply.as_ref()) {
                Some(reply) => Box::new(
                    reply.split_whitespace().map(str::to_owned).collect::<Vec<_>>().into_iter(),
                ),
                None => Box::new(derived_reply(&prompt)),
            };
        // A thinking model asked to think opens with its reasoning, as Qwen3 and its kin do.
        let thinks = self.settings.thinking == Some(true)
            && request.thinking == hangar_backend::ThinkingMode::Enabled;
        let words = thinks.then(|| reasoning(&prompt)).into_iter().flatten().chain(words);
        let room = CONTEXT_WORDS.saturating_sub(count_words(&prompt));
        let max_tokens = request.params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
        let stops = &request.params.stop;
        let latency = self.settings.token_latency_ms.filter(|&ms| ms > 0);

        // A resumed generation continues after the words it already produced.
        let mut output = request.resume.unwrap_or_default();
        let mut completion_tokens = count_words(&output);
        let mut finish_reason = FinishReason::Stop;
        let mut stop_sequence = None;
        for word in words.skip(completion_tokens as usize) {
            if completion_tokens >= max_tokens {
                finish_reason = FinishReason::Length;
                break;
            }
            let piece = if output.is_empty() { word } else { format!(" {word}") };
            let candidate = format!("{output}{piece}");
            let stopped =
                stops.iter().position(|s| !s.is_empty() && candidate.contains(s.as_str()));
            if let Some(i) = stopped {
                stop_sequence = u16::try_from(i).ok();
                break;
            }
            if let Some(ms) = latency {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    () = events.closed() => return Err(RuntimeError::Cancelled),
                }
            }
            if events.send(GenerateEvent::Text(piece)).await.is_err() {
                return Err(RuntimeError::Cancelled);
            }
            output = candidate;
            completion_tokens += 1;
        }
        Ok(GenerateSummary {
            finish_reason,
            prompt_tokens: count_words(&prompt).max(1),
            completion_tokens,
            cached_tokens: 0,
            stop_sequence,
        })
    }

    /// The words of the prompt, as [`Runtime::generate`] counts them.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u32, RuntimeError> {
        if let Some(e) = self.crash_error() {
            return Err(e);
        }
        self.admit(ModelType::Llm, "count tokens")?;
        Ok(count_words(&prompt_text(&request.prompt)).max(1))
    }

    /// One L2-normalized vector of [`EMBEDDING_DIM`] per input, derived from its hash.
    async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        self.admit(ModelType::Embedding, "embed")?;
        let vectors = request.inputs.iter().map(|input| embedding(input)).collect();
        let words = request.inputs.iter().map(|s| count_words(s)).fold(0, u32::saturating_add);
        Ok(Embeddings { vectors, prompt_tokens: words })
    }

    /// Scores each document by how many distinct query words (case-insensitive) it contains,
    /// plus a hash-derived fraction in `[0, 0.5)` that breaks ties deterministically.
    async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, RuntimeError> {
        self.admit(ModelType::Reranking, "rerank")?;
        let mut query: Vec<String> = normalized_words(&request.query).collect();
        query.sort();
        query.dedup();
        let scores = request
            .documents
            .iter()
            .map(|doc| {
                let doc_words: Vec<String> = normalized_words(doc).collect();
                let hits = query.iter().filter(|q| doc_words.contains(q)).count();
                let fraction = (fnv1a(doc.as_bytes()) % 1000) as f32 / 2000.0;
                hits as f32 + fraction
            })
            .collect();
        let prompt_tokens = request
            .documents
            .iter()
            .map(|d| count_words(d))
            .fold(count_words(&request.query), u32::saturating_add);
        Ok(Rerankings { scores, prompt_tokens })
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        match self.crash_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// With `sleeps`: gives its pretend GPU memory back and serves nothing until woken.
    async fn sleep(&self, level: SleepLevel) -> Result<(), RuntimeError> {
        if !self.capabilities.sleep_levels.contains(&level) {
            let message = format!("stub: cannot sleep at level {}", level.as_str());
            return Err(RuntimeError::Unsupported { message });
        }
        if !self.asleep.swap(true, Ordering::SeqCst)
            && let Some((gpu, mib)) = &self.gpu
        {
            gpu.give(*mib);
        }
        Ok(())
    }

    /// Takes its pretend GPU memory back and serves again (with `reply_after_wake`, wrong).
    async fn wake(&self) -> Result<(), RuntimeError> {
        if self.capabilities.sleep_levels.is_empty() {
            return Err(RuntimeError::Unsupported { message: "stub: cannot sleep".into() });
        }
        if self.asleep.swap(false, Ordering::SeqCst) {
            if let Some((gpu, mib)) = &self.gpu {
                gpu.take_back(*mib);
            }
            self.woken.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Waits `unload_delay_ms`, then stops counting this runtime as live (its pretend GPU
    /// memory given back, unless asleep, when it was given already).
    async fn unload(&self) {
        sleep_ms(self.settings.unload_delay_ms).await;
        if let Some((gpu, mib)) = &self.gpu
            && !self.asleep.swap(true, Ordering::SeqCst)
        {
            gpu.give(*mib);
        }
        self.live.release();
    }
}

/// The prompt as one text: a raw prompt, or the chat messages' contents joined by newlines.
fn prompt_text(prompt: &Prompt) -> String {
    match prompt {
        Prompt::Text(text) => text.clone(),
        Prompt::Chat(messages) => {
            messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n")
        }
    }
}

fn count_words(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

/// Lowercased words with surrounding punctuation trimmed.
fn normalized_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
        .filter(|w| !w.is_empty())
}

/// 64-bit FNV-1a: a stable hash, the same on every platform and in every process.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

/// SplitMix64: a tiny deterministic generator seeded from a hash.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

const VOCABULARY: [&str; 32] = [
    "the", "model", "answers", "with", "a", "stable", "reply", "of", "plain", "words", "that",
    "depend", "only", "on", "prompt", "text", "and", "nothing", "else", "so", "tests", "can",
    "predict", "every", "token", "it", "emits", "in", "order", "hangar", "stub", "runtime",
];

/// The reply to `prompt` when no fixed reply is configured: an endless stream of words
/// chosen by a generator seeded with the prompt's FNV-1a hash, so like a model without a
/// stop token it runs until `max_tokens` (`Length`) or a stop sequence.
fn derived_reply(prompt: &str) -> impl Iterator<Item = String> + Send + use<> {
    let mut rng = SplitMix64(fnv1a(prompt.as_bytes()));
    std::iter::from_fn(move || {
        Some(VOCABULARY[(rng.next() % VOCABULARY.len() as u64) as usize].to_owned())
    })
}

/// The reasoning a thinking stub writes before its reply: `<think> The prompt has N words.
/// </think>`, word by word.
fn reasoning(prompt: &str) -> Vec<String> {
    let count = count_words(prompt).to_string();
    ["<think>", "The", "prompt", "has", &count, "words.", "</think>"].map(str::to_owned).to_vec()
}

/// A unit vector derived from `input`'s hash.
fn embedding(input: &str) -> Vec<f32> {
    let mut rng = SplitMix64(fnv1a(input.as_bytes()));
    let mut v: Vec<f32> =
        (0..EMBEDDING_DIM).map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        v.iter_mut().for_each(|x| *x /= norm);
    } else {
        v = vec![0.0; EMBEDDING_DIM];
        v[0] = 1.0;
    }
    v
}
