//! The worker thread of one replica: it owns the llama.cpp model, context and samplers and
//! serves commands one at a time until its command channel closes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hangar_backend::{
    ChatMessage, EmbedRequest, Embeddings, FinishReason, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, ProgressSink, Prompt, RerankRequest, Rerankings, Role,
    RuntimeError, ToolCall,
};
use hangar_config::{BackendSettings, LlamaCppSettings, ModelConfig, ModelType, PromptFormat};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use tokio::sync::{mpsc, oneshot};

use crate::prompt::{self, RenderRequest, TOOL_CALL_OPEN};
use crate::structured::{self, Constraint};
use crate::{DEFAULT_MAX_TOKENS, RuntimeInfo, capture, settings};

/// A request for the worker, with where its answer goes.
pub(crate) enum Command {
    Generate {
        request: Box<GenerateRequest>,
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
}

/// Everything the worker needs to load its replica.
pub(crate) struct WorkerSpec {
    path: PathBuf,
    settings: LlamaCppSettings,
    model_type: ModelType,
    prompt_format: PromptFormat,
    progress: ProgressSink,
}

impl WorkerSpec {
    /// `gguf_n_gpu_layers`, which (with the file) determines the loaded weights.
    pub(crate) fn n_gpu_layers(&self) -> Option<i32> {
        self.settings.gguf_n_gpu_layers
    }

    pub(crate) fn new(model: &ModelConfig, path: &Path, progress: ProgressSink) -> Self {
        let settings = match &model.settings {
            BackendSettings::LlamaCpp(s) => s.clone(),
            _ => LlamaCppSettings::default(),
        };
        Self {
            path: path.to_owned(),
            settings,
            model_type: model.model_type,
            prompt_format: model.prompt_format.unwrap_or(PromptFormat::Auto),
            progress,
        }
    }
}

/// A model's weights, loaded once and shared by the workers of its replicas (read-only after
/// load; llama.cpp supports many contexts on one model), with what is derived from its vocab.
pub(crate) struct SharedModel {
    model: LlamaModel,
    /// Serializes context creation: `llama_init_from_model` mutates the model.
    new_context: std::sync::Mutex<()>,
    utf8: Utf8Guard,
}

/// What a worker reports once its replica is ready: llama.cpp's facts and the weights it
/// serves from (to share with the model's next replica).
pub(crate) type Ready = Result<(RuntimeInfo, Arc<SharedModel>), LoadError>;

/// Loads the GGUF on this thread, reporting llama.cpp's progress.
fn load_model(llama: &LlamaBackend, spec: &WorkerSpec) -> Result<Arc<SharedModel>, LoadError> {
    let progress = spec.progress.clone();
    let model_params = settings::model_params(
        &spec.settings,
        LlamaModelParams::default().with_progress_callback(move |p| {
            progress.report(p);
            true
        }),
    );
    let (loaded, errors) =
        capture::errors_during(|| LlamaModel::load_from_file(llama, &spec.path, &model_params));
    match loaded {
        Ok(model) => {
            let utf8 = Utf8Guard::new(&model);
            Ok(Arc::new(SharedModel { model, new_context: std::sync::Mutex::new(()), utf8 }))
        }
        Err(e) => {
            let message = if errors.is_empty() { e.to_string() } else { errors.join("; ") };
            Err(LoadError::Failed { message })
        }
    }
}

/// The worker's body: load the weights (unless another replica shares them), create the
/// context, report readiness, serve until the channel closes, drop all.
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
    let model = &shared.model;
    let ctx_params = settings::context_params(&spec.settings, spec.model_type);
    let (context, errors) = {
        let _serialized =
            shared.new_context.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        capture::errors_during(|| model.new_context(llama, ctx_params))
    };
    let context = match context {
        Ok(context) => context,
        Err(e) => {
            let message = if errors.is_empty() {
                format!("cannot create context: {e}")
            } else {
                format!("cannot create context: {}", errors.join("; "))
            };
            let _ = ready.send(Err(LoadError::Failed { message }));
            return;
        }
    };
    let info = RuntimeInfo {
        n_ctx: context.n_ctx(),
        n_batch: context.n_batch(),
        n_ctx_train: model.n_ctx_train(),
    };
    let mut worker = Worker { model, context, spec, utf8: &shared.utf8 };
    if ready.send(Ok((info, Arc::clone(&shared)))).is_err() {
        return; // the load was abandoned
    }
    while let Some(command) = commands.blocking_recv() {
        match command {
            Command::Generate { request, events, reply } => {
                let result = worker.generate(&request, &events, &reply);
                let _ = reply.send(result);
            }
            Command::Embed { request, reply } => {
                let _ = reply.send(worker.embed(&request));
            }
            Command::Rerank { request, reply } => {
                let _ = reply.send(worker.rerank(&request));
            }
        }
    }
    // The context is dropped here, on the thread that created it; the weights when the
    // model's last replica goes.
}

struct Worker<'m> {
    model: &'m LlamaModel,
    context: LlamaContext<'m>,
    spec: WorkerSpec,
    utf8: &'m Utf8Guard,
}

/// Keeps generated text valid UTF-8. Byte-fallback tokens (`<0x80>` …) can spell invalid
/// sequences, and llama.cpp's grammars accept bytes leniently, so invalid output would turn
/// into U+FFFD (and, say, overrun a schema's `maxLength`). Before each draw the guard removes
/// the tokens that would make the text invalid: at a character boundary those whose bytes
/// cannot start valid text; inside a multi-byte character everything except the
/// continuations that keep it valid.
struct Utf8Guard {
    /// Tokens whose bytes are no valid UTF-8 (prefix) on their own.
    invalid_alone: Vec<LlamaToken>,
    /// Tokens whose bytes start with a continuation byte, with those bytes.
    continuations: Vec<(LlamaToken, Vec<u8>)>,
}

/// Whether `bytes` is valid UTF-8, possibly ending inside a character.
fn valid_prefix(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

impl Utf8Guard {
    fn new(model: &LlamaModel) -> Self {
        let vocab = model.vocab();
        let mut guard = Self { invalid_alone: Vec::new(), continuations: Vec::new() };
        for id in 0..vocab.n_tokens() {
            let token = LlamaToken::new(id);
            let bytes = vocab.token_to_piece(token, false, None);
            if !valid_prefix(&bytes) {
                guard.invalid_alone.push(token);
            }
            if bytes.first().is_some_and(|b| (0x80..0xC0).contains(b)) {
                guard.continuations.push((token, bytes));
            }
        }
        guard
    }

    /// Masks the candidates that would make `pending` (the bytes of an unfinished character,
    /// usually none) invalid. Leaves everything as is when nothing valid would remain.
    fn mask(&self, candidates: &mut LlamaTokenDataArray, pending: &[u8]) {
        let data = &mut candidates.data;
        let len = data.len();
        let index = |t: LlamaToken| usize::try_from(t.0).ok().filter(|&i| i < len);
        if pending.is_empty() {
            for &token in &self.invalid_alone {
                if let Some(i) = index(token) {
                    data[i].set_logit(f32::NEG_INFINITY);
                }
            }
            return;
        }
        let allowed: Vec<usize> = self
            .continuations
            .iter()
            .filter(|(_, bytes)| valid_prefix(&[pending, bytes.as_slice()].concat()))
            .filter_map(|&(token, _)| index(token))
            .collect();
        if allowed.is_empty() {
            return;
        }
        let kept: Vec<f32> = allowed.iter().map(|&i| data[i].logit()).collect();
        data.iter_mut().for_each(|d| d.set_logit(f32::NEG_INFINITY));
        for (i, logit) in allowed.into_iter().zip(kept) {
            data[i].set_logit(logit);
        }
    }
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

impl Worker<'_> {
    /// The context a request may use: llama.cpp's, or the configured `gguf_n_ctx` when that
    /// is smaller (llama.cpp pads the context to a multiple of 256; the operator's limit is
    /// the one requests see).
    fn n_ctx(&self) -> usize {
        let configured = self.spec.settings.gguf_n_ctx.map_or(usize::MAX, |n| n as usize);
        (self.context.n_ctx() as usize).min(configured)
    }

    fn n_batch(&self) -> usize {
        (self.context.n_batch() as usize).max(1)
    }

    /// The prompt text: raw prompts as they are, chat through the configured format
    /// ([`crate::prompt::render`]), or for `auto` through the GGUF's embedded template.
    fn render(&self, request: &GenerateRequest) -> Result<String, RuntimeError> {
        let tools = request.tools.as_ref().map_or(&[][..], |t| t.tools.as_slice());
        let prepared;
        let prompt = match &request.prompt {
            Prompt::Chat(messages)
                if !tools.is_empty() || messages.iter().any(|m| !m.tool_calls.is_empty()) =>
            {
                prepared = Prompt::Chat(prompt::with_tools(messages, tools));
                &prepared
            }
            prompt => prompt,
        };
        let req = RenderRequest {
            prompt,
            thinking: request.thinking,
            translation: request.translation.as_ref(),
        };
        match prompt::render(self.spec.prompt_format, &req) {
            Ok(Some(text)) => Ok(text),
            Ok(None) => match prompt {
                Prompt::Chat(messages) => self.embedded_template(messages),
                Prompt::Text(text) => Ok(text.clone()),
            },
            Err(e) => Err(RuntimeError::InvalidRequest { message: e.to_string() }),
        }
    }

    /// Renders `messages` with the chat template embedded in the GGUF, through llama.cpp.
    fn embedded_template(&self, messages: &[ChatMessage]) -> Result<String, RuntimeError> {
        let template =
            self.model.chat_template(None).map_err(|e| RuntimeError::InvalidRequest {
                message: format!("model has no usable embedded chat template: {e}"),
            })?;
        let chat = messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::System => "system",
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::Tool => "tool",
                };
                LlamaChatMessage::new(role.to_owned(), m.content.clone())
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RuntimeError::InvalidRequest { message: e.to_string() })?;
        self.model.apply_chat_template(&template, &chat, true).map_err(|e| {
            RuntimeError::InvalidRequest {
                message: format!("llama.cpp cannot apply the embedded chat template: {e}"),
            }
        })
    }

    /// Tokenizes `text`; `add_special` adds BOS (and what else the vocab wants).
    fn tokenize(&self, text: &str, add_special: bool) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = vocab.tokenize(text.as_bytes(), add_special, true);
        // A template that spells out BOS plus add_special gives two.
        if tokens.len() >= 2 && tokens[0] == vocab.bos() && tokens[1] == vocab.bos() {
            tokens.remove(0);
        }
        tokens
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

    /// The sampler chain: the constraint's grammar first (so only tokens it allows remain),
    /// then greedy, or top-k / top-p / temperature / seeded draw.
    fn sampler(
        &self,
        request: &GenerateRequest,
        constraint: &Constraint,
    ) -> Result<LlamaSampler, RuntimeError> {
        let grammar = match constraint {
            Constraint::Free => None,
            Constraint::Json { grammar } | Constraint::Tools { grammar, lazy: false, .. } => {
                Some(LlamaSampler::grammar(self.model, grammar, structured::ROOT))
            }
            Constraint::Tools { grammar, lazy: true, .. } => Some(LlamaSampler::grammar_lazy(
                self.model,
                grammar,
                structured::ROOT,
                [TOOL_CALL_OPEN],
                &[],
            )),
        };
        let draw = Self::draw(request);
        match grammar {
            None => Ok(draw),
            Some(Ok(grammar)) => Ok(LlamaSampler::chain_simple([grammar, draw])),
            Some(Err(e)) => Err(failed(format!("llama.cpp rejected the grammar: {e}"))),
        }
    }

    fn draw(request: &GenerateRequest) -> LlamaSampler {
        let p = &request.params;
        match p.temperature {
            Some(t) if t > 0.0 => {
                let mut chain = Vec::new();
                if let Some(k) = p.top_k.filter(|&k| k > 0) {
                    chain.push(LlamaSampler::top_k(i32::try_from(k).unwrap_or(i32::MAX)));
                }
                if let Some(top_p) = p.top_p.filter(|&p| p > 0.0 && p < 1.0) {
                    chain.push(LlamaSampler::top_p(top_p, 1));
                }
                chain.push(LlamaSampler::temp(t));
                // LLAMA_DEFAULT_SEED (0xFFFFFFFF) picks a random seed.
                let seed = p.seed.map_or(u32::MAX, |s| (s ^ (s >> 32)) as u32);
                chain.push(LlamaSampler::dist(seed));
                LlamaSampler::chain_simple(chain)
            }
            _ => LlamaSampler::greedy(),
        }
    }

    fn generate(
        &mut self,
        request: &GenerateRequest,
        events: &mpsc::Sender<GenerateEvent>,
        reply: &oneshot::Sender<Result<GenerateSummary, RuntimeError>>,
    ) -> Result<GenerateSummary, RuntimeError> {
        if self.spec.model_type != ModelType::Llm {
            return Err(unsupported("generate", self.spec.model_type));
        }
        let text = self.render(request)?;
        let prompt = self.tokenize(&text, true);
        if prompt.is_empty() {
            return Err(RuntimeError::InvalidRequest { message: "empty prompt".to_owned() });
        }
        if prompt.len() >= self.n_ctx() {
            return Err(RuntimeError::InvalidRequest {
                message: format!(
                    "prompt is {} tokens, the context holds {}",
                    prompt.len(),
                    self.n_ctx()
                ),
            });
        }
        let max_tokens = request.params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let constraint = structured::plan(request)?;
        let mut sampler = self.sampler(request, &constraint)?;
        let mut output = Output::new(&request.params.stop, &constraint);
        self.context.clear_kv_cache();
        self.decode(&prompt, 0, false)?;

        let mut n_past = prompt.len();
        let mut completion = 0u32;
        let mut pending_bytes: Vec<u8> = Vec::new();
        let model = self.model;
        let vocab = model.vocab();
        let cancelled = || events.is_closed() || reply.is_closed();
        let send =
            |event: GenerateEvent| events.blocking_send(event).map_err(|_| RuntimeError::Cancelled);
        let mut finish_reason = loop {
            if completion >= max_tokens || n_past >= self.n_ctx() {
                break FinishReason::Length;
            }
            if cancelled() {
                return Err(RuntimeError::Cancelled);
            }
            let mut candidates =
                LlamaTokenDataArray::from_iter(self.context.candidates_ith(-1), false);
            self.utf8.mask(&mut candidates, &pending_bytes);
            sampler.apply(&mut candidates);
            let Some(token) = candidates.selected_token() else {
                return Err(failed("the sampler selected no token"));
            };
            sampler.accept(token);
            if vocab.is_eog(token) {
                break FinishReason::Stop;
            }
            completion += 1;
            pending_bytes.extend(vocab.token_to_piece(token, false, None));
            let piece = take_utf8(&mut pending_bytes);
            let (text, stopped) = output.push(&piece);
            if !text.is_empty() {
                send(GenerateEvent::Text(text))?;
            }
            if stopped {
                break FinishReason::Stop;
            }
            self.decode(&[token], n_past, false)?;
            n_past += 1;
        };
        // The guard keeps `pending_bytes` a valid prefix: what is left is the start of a
        // character that max_tokens cut off, not text.
        let (text, call) = output.finish();
        if !text.is_empty() {
            send(GenerateEvent::Text(text))?;
        }
        if let Some(call) = call {
            send(GenerateEvent::ToolCall(call))?;
            finish_reason = FinishReason::ToolCalls;
        }
        Ok(GenerateSummary {
            finish_reason,
            prompt_tokens: count(prompt.len()),
            completion_tokens: completion,
        })
    }

    /// Tokens of one embedding or rerank input, checked against the context.
    fn checked(&self, tokens: Vec<LlamaToken>) -> Result<Vec<LlamaToken>, RuntimeError> {
        let limit = self.n_ctx().min(self.context.n_ubatch() as usize);
        if tokens.is_empty() {
            return Err(RuntimeError::InvalidRequest { message: "empty input".to_owned() });
        }
        if tokens.len() > limit {
            return Err(RuntimeError::InvalidRequest {
                message: format!("input is {} tokens, at most {limit} fit", tokens.len()),
            });
        }
        Ok(tokens)
    }

    /// The pooled output of one sequence (mean over tokens when the model pools nothing).
    fn pooled(&mut self, tokens: &[LlamaToken]) -> Result<Vec<f32>, RuntimeError> {
        self.context.clear_kv_cache();
        self.decode(tokens, 0, true)?;
        if let Ok(v) = self.context.embeddings_seq_ith(0) {
            return Ok(v.to_vec());
        }
        let mut sum: Vec<f32> = Vec::new();
        for i in 0..tokens.len() {
            let e = self
                .context
                .embeddings_ith(i32::try_from(i).map_err(failed)?)
                .map_err(|e| failed(format!("no embeddings from llama.cpp: {e}")))?;
            if sum.is_empty() {
                sum = vec![0.0; e.len()];
            }
            sum.iter_mut().zip(e).for_each(|(s, x)| *s += x);
        }
        let n = tokens.len() as f32;
        sum.iter_mut().for_each(|s| *s /= n);
        Ok(sum)
    }

    fn embed(&mut self, request: &EmbedRequest) -> Result<Embeddings, RuntimeError> {
        if self.spec.model_type != ModelType::Embedding {
            return Err(unsupported("embed", self.spec.model_type));
        }
        let mut vectors = Vec::with_capacity(request.inputs.len());
        let mut prompt_tokens = 0u32;
        for input in &request.inputs {
            let tokens =
                self.checked(self.model.vocab().tokenize(input.as_bytes(), true, false))?;
            prompt_tokens = prompt_tokens.saturating_add(count(tokens.len()));
            let mut v = self.pooled(&tokens)?;
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > f32::EPSILON {
                v.iter_mut().for_each(|x| *x /= norm);
            }
            vectors.push(v);
        }
        Ok(Embeddings { vectors, prompt_tokens })
    }

    /// `[BOS] query [EOS] [SEP] document [EOS]`, each special token where the vocab uses it
    /// (llama.cpp server's rerank layout for models without a rerank template).
    fn rerank_tokens(&self, query: &str, document: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = Vec::new();
        let special = |t: LlamaToken| t.0 >= 0;
        if vocab.should_add_bos() && special(vocab.bos()) {
            tokens.push(vocab.bos());
        }
        tokens.extend(vocab.tokenize(query.as_bytes(), false, false));
        let eos = if special(vocab.eos()) { vocab.eos() } else { vocab.sep() };
        if special(eos) {
            tokens.push(eos);
        }
        if vocab.should_add_sep() && special(vocab.sep()) && vocab.sep() != eos {
            tokens.push(vocab.sep());
        }
        tokens.extend(vocab.tokenize(document.as_bytes(), false, false));
        if special(eos) {
            tokens.push(eos);
        }
        tokens
    }

    fn rerank(&mut self, request: &RerankRequest) -> Result<Rerankings, RuntimeError> {
        if self.spec.model_type != ModelType::Reranking {
            return Err(unsupported("rerank", self.spec.model_type));
        }
        let mut scores = Vec::with_capacity(request.documents.len());
        let mut prompt_tokens = 0u32;
        for document in &request.documents {
            let tokens = self.checked(self.rerank_tokens(&request.query, document))?;
            prompt_tokens = prompt_tokens.saturating_add(count(tokens.len()));
            let out = self.pooled(&tokens)?;
            scores.push(out.first().copied().ok_or_else(|| failed("empty rank output"))?);
        }
        Ok(Rerankings { scores, prompt_tokens })
    }
}

/// Routes generated text: content through the stop sequences to the client, and, when the
/// request has tools, everything from [`TOOL_CALL_OPEN`] on into the tool call.
struct Output<'a> {
    /// Content, with the request's stop sequences.
    content: StopStream<'a>,
    /// Watches the content for the start of a tool call (tools only).
    opener: Option<StopStream<'static>>,
    /// The call's text after [`TOOL_CALL_OPEN`], once the model started one.
    call: Option<String>,
    /// Functions a call may name.
    names: &'a [String],
}

impl<'a> Output<'a> {
    fn new(stops: &'a [String], constraint: &'a Constraint) -> Self {
        let (opener, names) = match constraint {
            Constraint::Tools { names, .. } => {
                (Some(StopStream::with(vec![TOOL_CALL_OPEN])), names.as_slice())
            }
            _ => (None, &[][..]),
        };
        Self { content: StopStream::new(stops), opener, call: None, names }
    }

    /// Adds a piece; returns the content to send now and whether a stop sequence ended it.
    fn push(&mut self, piece: &str) -> (String, bool) {
        if let Some(call) = &mut self.call {
            call.push_str(piece);
            return (String::new(), false);
        }
        let Some(opener) = &mut self.opener else {
            return self.content.push(piece);
        };
        let (text, opened) = opener.push(piece);
        let (out, stopped) = self.content.push(&text);
        if opened && !stopped {
            self.call = Some(opener.take_after());
        }
        (out, stopped)
    }

    /// Ends the output: the content still held back, and the tool call if the model wrote a
    /// complete one. An incomplete call (cut by `max_tokens`) is returned as content, as
    /// written.
    fn finish(mut self) -> (String, Option<ToolCall>) {
        if let Some(call) = self.call.take() {
            return match structured::parse_call(&call, self.names) {
                Some(parsed) => (self.content.finish(""), Some(parsed)),
                None => (self.content.finish(&format!("{TOOL_CALL_OPEN}{call}")), None),
            };
        }
        if self.content.stopped {
            return (String::new(), None);
        }
        let held = self.opener.as_mut().map(|o| o.finish("")).unwrap_or_default();
        let (mut out, stopped) = self.content.push(&held);
        if !stopped {
            out.push_str(&self.content.finish(""));
        }
        (out, None)
    }
}

/// Takes the longest valid UTF-8 prefix out of `bytes` (a token can end mid-character).
fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => s.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes that no continuation can fix: replace them.
        Err(_) => {
            let s = String::from_utf8_lossy(bytes).into_owned();
            bytes.clear();
            return s;
        }
    };
    let rest = bytes.split_off(valid);
    String::from_utf8(std::mem::replace(bytes, rest)).unwrap_or_default()
}

/// Streams generated text while holding back what could be the start of a stop sequence.
#[derive(Debug)]
pub(crate) struct StopStream<'a> {
    stops: Vec<&'a str>,
    held: String,
    /// What followed the stop sequence in the text pushed so far.
    after: String,
    stopped: bool,
}

impl<'a> StopStream<'a> {
    pub(crate) fn new(stops: &'a [String]) -> Self {
        Self::with(stops.iter().map(String::as_str).collect())
    }

    pub(crate) fn with(stops: Vec<&'a str>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            after: String::new(),
            stopped: false,
        }
    }

    /// The text that followed the stop sequence (after [`Self::push`] reported a stop).
    pub(crate) fn take_after(&mut self) -> String {
        std::mem::take(&mut self.after)
    }

    /// Adds `piece`; returns what may be emitted now and whether a stop sequence completed
    /// (the text before it is emitted, the stop sequence and what follows are not).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let found =
            self.stops.iter().filter_map(|s| self.held.find(s).map(|at| (at, s.len()))).min();
        if let Some((at, len)) = found {
            self.after = self.held.split_off(at + len);
            self.held.truncate(at);
            self.stopped = true;
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&n| s.is_char_boundary(n))
                    .filter(|&n| self.held.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0);
        let emit = self.held.len() - keep;
        let rest = self.held.split_off(emit);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// Flushes what was held back, plus `tail` (undecodable trailing bytes).
    pub(crate) fn finish(&mut self, tail: &str) -> String {
        let mut out = std::mem::take(&mut self.held);
        out.push_str(tail);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        let mut stream = StopStream::new(&stops);
        let mut out = String::new();
        for piece in pieces {
            let (emit, stopped) = stream.push(piece);
            out.push_str(&emit);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&stream.finish(""));
        (out, false)
    }

    #[test]
    fn stop_sequences_cut_the_text_even_across_pieces() {
        assert_eq!(run(&["END"], &["ab", "cE", "N", "Dxyz"]), ("abc".to_owned(), true));
        assert_eq!(run(&["END"], &["ab", "cE", "N"]), ("abcEN".to_owned(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_owned(), false));
        assert_eq!(run(&["x", "bc"], &["abcx"]), ("a".to_owned(), true));
    }

    /// Pushes `pieces` through an [`Output`] for tools; returns the content sent and the call.
    fn route(pieces: &[&str], stops: &[&str]) -> (String, Option<ToolCall>) {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        let constraint = Constraint::Tools {
            grammar: String::new(),
            lazy: true,
            names: vec!["get_weather".to_owned()],
        };
        let mut output = Output::new(&stops, &constraint);
        let mut content = String::new();
        for piece in pieces {
            let (text, stopped) = output.push(piece);
            content.push_str(&text);
            if stopped {
                break;
            }
        }
        let (rest, call) = output.finish();
        content.push_str(&rest);
        (content, call)
    }

    #[test]
    fn tool_calls_are_routed_out_of_the_content_even_across_pieces() {
        let call = r#"{"name": "get_weather", "arguments": {"unit": "c"}}"#;
        let (content, parsed) =
            route(&["Let me check. <tool", "_call>\n", call, "\n</tool_call>"], &[]);
        assert_eq!(content, "Let me check. ");
        let parsed = parsed.expect("a complete call");
        assert_eq!(
            (parsed.name.as_str(), parsed.arguments.as_str()),
            ("get_weather", r#"{"unit":"c"}"#)
        );
        // A call cut short (max_tokens) is returned as the text the model wrote.
        let (content, parsed) = route(&["a <tool_call>\n{\"name\": \"get_w"], &[]);
        assert_eq!((content.as_str(), parsed), ("a <tool_call>\n{\"name\": \"get_w", None));
        // Text that only looks like the start of a tag is released at the end.
        assert_eq!(route(&["x <tool"], &[]), ("x <tool".to_owned(), None));
        // Stop sequences still cut the content before a call.
        assert_eq!(route(&["ab STOP <tool_call>", call], &["STOP"]), ("ab ".to_owned(), None));
    }

    #[test]
    fn utf8_is_emitted_only_when_complete() {
        let mut bytes = vec![b'a', 0xC3];
        assert_eq!(take_utf8(&mut bytes), "a");
        bytes.push(0xA9);
        assert_eq!(take_utf8(&mut bytes), "é");
        assert!(bytes.is_empty());
    }
}
