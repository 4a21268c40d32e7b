//! Request, response and capability types shared by every backend.

use std::num::NonZeroU32;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// An input modality a model accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    /// Text.
    Text,
    /// Images.
    Image,
}

/// A request-level thinking mode.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ThinkingMode {
    /// Keep the model's configured behaviour.
    #[default]
    Default,
    /// Ask the model to think.
    Enabled,
    /// Ask the model not to think.
    Disabled,
}

impl ThinkingMode {
    /// The snake_case name.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }
}

/// What a model supports, as the admin API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Input modalities accepted.
    pub modalities: Vec<Modality>,
    /// Whether a multi-turn `messages` array is accepted.
    pub multi_turn: bool,
    /// Accepted values of request-level `thinking`; always includes `default`.
    pub thinking_modes: Vec<ThinkingMode>,
    /// Sequences one replica can run in parallel; `None` when the engine does not limit
    /// it. The scheduler clamps `target_inflight` to this.
    #[serde(skip)]
    pub max_parallel_sequences: Option<NonZeroU32>,
    /// Requests the scheduler may hand one replica beyond its in-flight target, for an
    /// engine that queues requests itself (a server process): it then starts the next
    /// request the moment one ends instead of idling for a round trip through Hangar. 0 for
    /// an engine that runs only what it is given.
    #[serde(skip)]
    pub dispatch_ahead: u32,
    /// Whether a generation can be resumed from text it already produced
    /// ([`GenerateRequest::resume`]); what a `retract` pause needs to put a running request
    /// back in the queue without its client noticing.
    #[serde(skip)]
    pub resumable: bool,
    /// How deeply a runtime can sleep ([`Runtime::sleep`](crate::Runtime::sleep)), lightest
    /// first; empty when it cannot (it is unloaded instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sleep_levels: Vec<SleepLevel>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            modalities: vec![Modality::Text],
            multi_turn: true,
            thinking_modes: vec![ThinkingMode::Default],
            max_parallel_sequences: None,
            dispatch_ahead: 0,
            resumable: false,
            sleep_levels: Vec::new(),
        }
    }
}

/// How deeply a runtime sleeps: what it gives back, and so what waking costs. A sleeping
/// runtime keeps its engine (process, thread, loaded file) and serves nothing until woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum SleepLevel {
    /// The context goes (KV cache, compute buffers, the prompt cache with them); the
    /// weights stay where they were loaded. Waking creates a context again. What llama.cpp
    /// can do: it cannot move offloaded weights back to the host.
    Context,
    /// vLLM's level 1: the weights move to host memory and the KV cache is discarded; waking
    /// copies the weights back.
    WeightsToHost,
    /// vLLM's level 2: the weights and the KV cache are discarded; waking reloads the
    /// weights from disk.
    WeightsDiscarded,
}

impl SleepLevel {
    /// The snake_case name the API shows.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Role {
    /// System prompt.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// The snake_case name (`system`, `user`, `assistant`, `tool`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
    /// Tools the assistant called in this turn (assistant messages of a tool-use history).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    /// A plain text message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), tool_calls: Vec::new() }
    }
}

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: serde_json::Value,
}

/// Which tool calls a generation may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides between text and a tool call.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this tool.
    Function(String),
}

/// The tools of a generation request and the request's `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    /// Callable functions; never empty.
    pub tools: Vec<ToolDefinition>,
    /// Whether and which tool must be called.
    pub choice: ToolChoice,
}

/// One tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The called function's name.
    pub name: String,
    /// Its arguments: a JSON object, serialized.
    pub arguments: String,
}

/// A structure the generated text must have, enforced while decoding (structured outputs).
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON Schema (`response_format: {"type": "json_schema"}`).
    JsonSchema(serde_json::Value),
}

/// The input of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// A raw prompt (`/v1/completions`).
    Text(String),
    /// Chat messages (`/v1/chat/completions`, `/v1/responses`).
    Chat(Vec<ChatMessage>),
}

/// Sampling and stopping parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingParams {
    /// Most tokens to generate; `None` generates until the model stops or its context is
    /// full (the runtime fills in a model's configured `default_max_tokens` first).
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Top-k sampling.
    pub top_k: Option<u32>,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
    /// Stop sequences.
    pub stop: Vec<String>,
}

/// A generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// The input.
    pub prompt: Prompt,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Request-level thinking mode; already checked against the capabilities.
    pub thinking: ThinkingMode,
    /// Language codes of a TranslateGemma request, when the caller sent them.
    pub translation: Option<Translation>,
    /// Tools the model may call; `None` when the request has none (or `tool_choice: none`).
    pub tools: Option<ToolUse>,
    /// A structure the text must have; `None` for free text.
    pub format: Option<OutputFormat>,
    /// Text this request already generated and its client already received (an earlier run
    /// was retracted by a pause): the engine continues after it as if it had generated it
    /// itself — it is not sent again, and its tokens count toward `max_tokens` and
    /// `completion_tokens`. Only set for runtimes whose capabilities say `resumable`.
    pub resume: Option<String>,
}

impl GenerateRequest {
    /// A request for `prompt` with default parameters, no tools and free text.
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            params: SamplingParams::default(),
            thinking: ThinkingMode::Default,
            translation: None,
            tools: None,
            format: None,
            resume: None,
        }
    }
}

/// The language codes of a TranslateGemma request (`POST /v1/responses`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Translation {
    /// Source language; `None`, `"auto"` or `"mixed"` asks the model to detect the language
    /// of each segment (mixed-source input).
    pub source_lang_code: Option<String>,
    /// Target language.
    pub target_lang_code: String,
}

/// A piece of generated output.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateEvent {
    /// Generated text (one token or a few).
    Text(String),
    /// A complete tool call (sent once its arguments are complete).
    ToolCall(ToolCall),
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model called tools ([`GenerateEvent::ToolCall`]).
    ToolCalls,
}

/// The end of a generation: why it stopped and what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateSummary {
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Prompt tokens the engine reused from an earlier request instead of decoding them again
    /// (a prompt cache); 0 when it has none.
    pub cached_tokens: u32,
    /// The position in the request's `params.stop` of the stop sequence that ended the
    /// generation; `None` when something else ended it, or the engine cannot tell.
    pub stop_sequence: Option<u16>,
}

/// An embedding request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedRequest {
    /// Texts to embed, in order.
    pub inputs: Vec<String>,
}

/// Embeddings, one per input, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// L2-normalized vectors.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens consumed.
    pub prompt_tokens: u32,
}

/// A rerank request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankRequest {
    /// The query.
    pub query: String,
    /// Candidate documents.
    pub documents: Vec<String>,
}

/// Rerank results.
#[derive(Debug, Clone, PartialEq)]
pub struct Rerankings {
    /// One score per document, in document order (higher is more relevant).
    pub scores: Vec<f32>,
    /// Tokens consumed.
    pub prompt_tokens: u32,
}

/// Receives load progress in `[0, 1]`. Cheap to clone; a no-op sink ignores everything.
#[derive(Clone, Default)]
pub struct ProgressSink(Option<Arc<dyn Fn(f32) + Send + Sync>>);

impl ProgressSink {
    /// A sink that calls `f` with each progress value.
    pub fn new(f: impl Fn(f32) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    /// Reports progress, clamped to `[0, 1]`.
    pub fn report(&self, progress: f32) {
        if let Some(f) = &self.0 {
            f(progress.clamp(0.0, 1.0));
        }
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ProgressSink(..)" } else { "ProgressSink(none)" })
    }
}

/// Receives the reason when a loaded runtime's engine dies on its own (a child process
/// exited). Cheap to clone; the default sink ignores it.
#[derive(Clone, Default)]
pub struct CrashSink(Option<Arc<dyn Fn(String) + Send + Sync>>);

impl CrashSink {
    /// A sink that calls `f` with the reason.
    pub fn new(f: impl Fn(String) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    /// Reports that the engine died, and why.
    pub fn report(&self, reason: String) {
        if let Some(f) = &self.0 {
            f(reason);
        }
    }
}

impl std::fmt::Debug for CrashSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "CrashSink(..)" } else { "CrashSink(none)" })
    }
}
