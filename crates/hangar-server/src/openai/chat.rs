//! `POST /v1/chat/completions`: the request, the `chat.completion` answer and its
//! `chat.completion.chunk` stream.

use bytes::Bytes;
use hangar_runtime::Work;
use hangar_runtime::engine::{FinishReason, GenerateRequest, GenerateSummary, Prompt, ToolCall};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::messages::ChatMessageIn;
use super::sampling::{SamplingFields, StreamOptions};
use super::stream::{
    Generated, StreamFormat, data_event, done_event, generate_all, stream_generation,
};
use super::{Recorder, Reply, Usage, constant, new_id, unix_now};
use crate::body::{Response, json_response, parse_json};
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::router::Ctx;
use crate::tools::{self, ChatTool, ResponseFormat, ToolCallOut, ToolChoiceIn};

/// Body of `POST /v1/chat/completions` (OpenAI's shape). Fields not listed here are
/// accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatCompletionRequest {
    /// The configured model's name.
    #[schemars(required, length(min = 1))]
    model: Option<String>,
    /// The conversation so far; must not be empty.
    #[schemars(required, length(min = 1))]
    messages: Option<Vec<ChatMessageIn>>,
    /// Most tokens to generate (legacy name of `max_completion_tokens`); without either,
    /// the model's `default_max_tokens`, else until the model stops or its context is full.
    #[schemars(range(min = 1))]
    max_tokens: Option<u32>,
    /// Most tokens to generate; wins over `max_tokens` when both are set.
    #[schemars(range(min = 1))]
    max_completion_tokens: Option<u32>,
    /// Sampling.
    #[serde(flatten)]
    sampling: SamplingFields,
    /// Answer with server-sent events (`chat.completion.chunk` objects, then `[DONE]`).
    stream: Option<bool>,
    /// Streaming options.
    stream_options: Option<StreamOptions>,
    /// Request-level thinking mode; must be one of the model's `capabilities.thinking_modes`,
    /// else 400 `thinking_unsupported`.
    thinking: Option<crate::wire::ThinkingMode>,
    /// `{"type": "text"}` (default), `{"type": "json_object"}`, or `{"type": "json_schema",
    /// "json_schema": {"name": …, "schema": {…}}}`: engines with constrained decoding
    /// (llama_cpp) then only produce JSON that satisfies it. Not combinable with `tools`.
    response_format: Option<ResponseFormat>,
    /// Functions the model may call (`[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`). Calls come back in `message.tool_calls` with `finish_reason:
    /// "tool_calls"`; a generation makes at most one call.
    tools: Option<Vec<ChatTool>>,
    /// `auto` (default with tools: text or a call), `required` (always a call), `none`, or
    /// `{"type": "function", "function": {"name": …}}` (always a call of that function).
    tool_choice: Option<ToolChoiceIn>,
}

constant!(
    /// `chat.completion`.
    ChatCompletionObject = "chat.completion"
);
constant!(
    /// `chat.completion.chunk`.
    ChunkObject = "chat.completion.chunk"
);
constant!(
    /// `assistant`.
    AssistantRole = "assistant"
);

/// The answer of a non-streamed chat completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatCompletion {
    /// Unique id (`chatcmpl-…`).
    id: String,
    /// Always `chat.completion`.
    object: ChatCompletionObject,
    /// Unix seconds.
    created: u64,
    /// The model.
    model: String,
    /// Always `null`.
    system_fingerprint: Option<String>,
    /// The one choice.
    choices: Vec<ChatChoice>,
    /// Token usage.
    usage: Usage,
}

/// The choice of a chat completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatChoice {
    /// Always 0.
    index: u32,
    /// The generated message.
    message: AssistantMessage,
    /// Always `null`.
    logprobs: (),
    /// Why generation stopped.
    finish_reason: crate::wire::FinishReason,
    /// The stop sequence that ended the answer, when one did (vLLM's field).
    stop_reason: Option<String>,
}

/// The assistant message of a chat completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct AssistantMessage {
    /// Always `assistant`.
    role: AssistantRole,
    /// The text; `null` when the model only called a tool.
    content: Option<String>,
    /// Always `null`.
    refusal: Option<String>,
    /// The tools the model called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallOut>>,
}

/// One event of a streamed chat completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatCompletionChunk {
    /// The completion's id, the same in every chunk.
    id: String,
    /// Always `chat.completion.chunk`.
    object: ChunkObject,
    /// Unix seconds.
    created: u64,
    /// The model.
    model: String,
    /// Always `null`.
    system_fingerprint: Option<String>,
    /// The delta of the one choice; empty in the usage chunk.
    choices: Vec<ChunkChoice>,
    /// With `stream_options.include_usage`: `null`, then the usage in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

/// The choice of a chunk.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChunkChoice {
    /// Always 0.
    index: u32,
    /// What this chunk adds.
    delta: ChunkDelta,
    /// Always `null`.
    logprobs: (),
    /// Set in the last content chunk.
    finish_reason: Option<crate::wire::FinishReason>,
    /// With `finish_reason`: the stop sequence that ended the answer, when one did (vLLM's
    /// field).
    stop_reason: Option<String>,
}

/// What a chunk adds to the message.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChunkDelta {
    /// `assistant`, in the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<AssistantRole>,
    /// More text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    /// A complete tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallOut>>,
}

/// `POST /v1/chat/completions`.
pub(crate) async fn handle(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::ChatCompletions);
    let reply = chat(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn chat(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let route = hangar_runtime::engine::ForwardRoute::ChatCompletions;
    super::limits::check(ctx, rec, route)?;
    if let Some(reply) = super::forward::forwarded(ctx, rec, route).await {
        return reply;
    }
    let body: ChatCompletionRequest = parse_json(&ctx.body, false)?;
    let model = rec.model(body.model)?;
    let messages = body.messages.unwrap_or_default();
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must be a non-empty array"));
    }
    let messages = messages
        .into_iter()
        .map(ChatMessageIn::into_message)
        .collect::<Result<Vec<_>, ApiError>>()?;
    let (tools, format) = tools::chat_output(body.tools, body.tool_choice, body.response_format)?;
    let max_tokens = match (body.max_completion_tokens, body.max_tokens) {
        (Some(n), _) => (Some(n), "max_completion_tokens"),
        (None, n) => (n, "max_tokens"),
    };
    let params = body.sampling.params(max_tokens)?;
    let request = GenerateRequest {
        prompt: Prompt::Chat(messages),
        params,
        thinking: body.thinking.map(Into::into).unwrap_or_default(),
        translation: None,
        tools,
        format,
        resume: None,
    };
    let guard = ctx.state.manager.admit(&model, Work::generation(&request)).await?;
    let (id, created) = (new_id("chatcmpl-"), unix_now());
    let stops = request.params.stop.clone();
    if body.stream.unwrap_or(false) {
        let include_usage = body.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        let format = ChatStream { id, created, model, include_usage, calls: 0, stops };
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, calls, summary } = generate_all(guard, request, rec).await?;
    let tool_calls: Vec<ToolCallOut> = calls.iter().map(|c| ToolCallOut::new(c, None)).collect();
    let content = if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) };
    let message = AssistantMessage {
        role: AssistantRole::Value,
        content,
        refusal: None,
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
    };
    let answer = ChatCompletion {
        id,
        object: ChatCompletionObject::Value,
        created,
        model,
        system_fingerprint: None,
        choices: vec![ChatChoice {
            index: 0,
            message,
            logprobs: (),
            finish_reason: summary.finish_reason.into(),
            stop_reason: stop_met(&stops, &summary),
        }],
        usage: Usage::of(&summary),
    };
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}

/// Writes `chat.completion.chunk` events.
struct ChatStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Tool calls sent so far (the next call's `index`).
    calls: u32,
    /// The request's stop sequences, for the one that ended it.
    stops: Vec<String>,
}

/// The stop sequence of `stops` that ended the generation, if one did.
fn stop_met(stops: &[String], summary: &GenerateSummary) -> Option<String> {
    stops.get(usize::from(summary.stop_sequence?)).cloned()
}

impl ChatStream {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Bytes {
        data_event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: ChunkObject::Value,
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: self.include_usage.then_some(usage),
        })
    }

    fn choice(delta: ChunkDelta, finish_reason: Option<FinishReason>) -> Vec<ChunkChoice> {
        vec![ChunkChoice {
            index: 0,
            delta,
            logprobs: (),
            finish_reason: finish_reason.map(Into::into),
            stop_reason: None,
        }]
    }
}

impl StreamFormat for ChatStream {
    fn start(&mut self) -> Vec<Bytes> {
        let delta = ChunkDelta {
            role: Some(AssistantRole::Value),
            content: Some(String::new()),
            ..ChunkDelta::default()
        };
        vec![self.chunk(Self::choice(delta, None), None)]
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        let delta = ChunkDelta { content: Some(text.to_owned()), ..ChunkDelta::default() };
        vec![self.chunk(Self::choice(delta, None), None)]
    }

    /// The whole call in one delta (`id`, `type`, name and complete arguments).
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes> {
        let entry = ToolCallOut::new(&call, Some(self.calls));
        self.calls += 1;
        let delta = ChunkDelta { tool_calls: Some(vec![entry]), ..ChunkDelta::default() };
        vec![self.chunk(Self::choice(delta, None), None)]
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut last = Self::choice(ChunkDelta::default(), Some(summary.finish_reason));
        last[0].stop_reason = stop_met(&self.stops, summary);
        let mut events = vec![self.chunk(last, None)];
        if self.include_usage {
            events.push(self.chunk(Vec::new(), Some(Usage::of(summary))));
        }
        events.push(done_event());
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![data_event(&error.to_body()), done_event()]
    }
}
