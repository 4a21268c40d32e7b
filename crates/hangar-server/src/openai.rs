//! OpenAI-compatible inference routes: chat completions, completions, the Responses API,
//! embeddings, rerank, and the model list.
//!
//! Every generation request goes through the same steps: parse (422 with the parser's
//! position), validate (400 `invalid_request`), check the model's capabilities (404
//! `unknown_model`, 400 `thinking_unsupported`), admit ([`hangar_runtime::Manager::acquire`]:
//! 503 with the state's code, 429 `queue_full`), then run. Streams are only started once
//! admission succeeded and the generation produced its first event, so admission errors,
//! and generations that fail before any output (a prompt longer than the context, a schema
//! the engine cannot use), are plain JSON error responses. A stream's generation runs in its
//! own task that forwards the backend's events as SSE
//! chunks; when the client goes away the forwarding stops, the generation's event receiver
//! is dropped, the backend cancels, and the request's slot is freed.
//!
//! Every inference request is recorded in the request metrics by endpoint, model (or
//! `_unknown` for names not in config) and outcome (`ok` or the error code); streams are
//! recorded when they end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hangar_backend::{
    ChatMessage, EmbedRequest, FinishReason, GenerateEvent, GenerateRequest, GenerateSummary,
    Prompt, RerankRequest, Role, RuntimeError, SamplingParams, ThinkingMode, ToolCall, Translation,
};
use hangar_runtime::{ModelSnapshot, RequestGuard};
use http::StatusCode;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::body::{Response, json_response, parse_json, sse_event, sse_response};
use crate::error::{ApiError, codes};
use crate::router::Ctx;
use crate::state::AppState;
use crate::tools::{
    self, ChatTool, ResponseFormat, ResponsesText, ResponsesTool, ToolCallIn, ToolChoiceIn,
};

/// The metrics label of requests for models that are not in config.
const UNKNOWN_MODEL_LABEL: &str = "_unknown";

// ---------------------------------------------------------------------------------------
// Request types (also the OpenAPI schemas)
// ---------------------------------------------------------------------------------------

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MessageRole {
    /// System prompt.
    System,
    /// Developer instructions (treated as a system prompt).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl From<MessageRole> for Role {
    fn from(role: MessageRole) -> Self {
        match role {
            MessageRole::System | MessageRole::Developer => Role::System,
            MessageRole::User => Role::User,
            MessageRole::Assistant => Role::Assistant,
            MessageRole::Tool => Role::Tool,
        }
    }
}

/// A message's content: a string, or a list of content parts.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only text parts (`text`, `input_text`, `output_text`) are supported.
    Parts(Vec<ContentPart>),
}

/// One content part of a message.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ContentPart {
    /// The part's type: `text` (chat completions), `input_text` or `output_text` (Responses
    /// API). Other types (images, audio, files) are refused with 400 `invalid_request`.
    #[serde(rename = "type")]
    kind: String,
    /// The text of a text part.
    #[serde(default)]
    text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ChatMessageIn {
    /// Who wrote it: `system`, `developer`, `user`, `assistant` or `tool`.
    role: MessageRole,
    /// What was said: a string or a list of text parts. `null` is read as empty.
    #[serde(default)]
    content: Option<MessageContent>,
    /// The tools an assistant message called (a tool-use history); answer each with a
    /// `tool` message.
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallIn>>,
}

/// Stop sequences: one string or a list of strings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum StopSequences {
    /// One stop sequence.
    One(String),
    /// Several stop sequences.
    Many(Vec<String>),
}

/// Streaming options.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the token usage (and `choices: []`) before `[DONE]`.
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Body of `POST /v1/chat/completions` (OpenAI's shape). Fields not listed here are
/// accepted and ignored.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ChatCompletionRequest {
    /// The configured model's name.
    #[schemars(required)]
    model: Option<String>,
    /// The conversation so far; must not be empty.
    #[schemars(required, length(min = 1))]
    messages: Option<Vec<ChatMessageIn>>,
    /// Most tokens to generate (legacy name of `max_completion_tokens`).
    #[schemars(range(min = 1))]
    max_tokens: Option<u32>,
    /// Most tokens to generate; wins over `max_tokens` when both are set.
    #[schemars(range(min = 1))]
    max_completion_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2.
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f64>,
    /// Nucleus sampling mass, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f64>,
    /// Top-k sampling (extension).
    top_k: Option<u32>,
    /// Seed for reproducible sampling.
    seed: Option<u64>,
    /// Stop sequences: a string or a list of strings.
    stop: Option<StopSequences>,
    /// Answer with server-sent events (`chat.completion.chunk` objects, then `[DONE]`).
    stream: Option<bool>,
    /// Streaming options.
    stream_options: Option<StreamOptions>,
    /// Number of choices; only 1 is supported.
    #[schemars(range(min = 1, max = 1))]
    n: Option<u32>,
    /// Request-level thinking mode; must be one of the model's `capabilities.thinking_modes`,
    /// else 400 `thinking_unsupported`.
    thinking: Option<ThinkingMode>,
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

/// A completion prompt.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum CompletionPrompt {
    /// One prompt.
    Text(String),
    /// A list holding exactly one prompt (batches are not supported).
    Texts(Vec<String>),
    /// Anything else (token arrays): refused with 400.
    #[schemars(skip)]
    Other(Value),
}

/// Body of `POST /v1/completions` (OpenAI's shape). Fields not listed here are accepted and
/// ignored.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct CompletionRequest {
    /// The configured model's name.
    #[schemars(required)]
    model: Option<String>,
    /// The prompt: a string, or a list of exactly one string. Token arrays are refused.
    #[schemars(required)]
    prompt: Option<CompletionPrompt>,
    /// Most tokens to generate.
    #[schemars(range(min = 1))]
    max_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2.
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f64>,
    /// Nucleus sampling mass, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f64>,
    /// Top-k sampling (extension).
    top_k: Option<u32>,
    /// Seed for reproducible sampling.
    seed: Option<u64>,
    /// Stop sequences: a string or a list of strings.
    stop: Option<StopSequences>,
    /// Answer with server-sent events (`text_completion` chunks, then `[DONE]`).
    stream: Option<bool>,
    /// Streaming options.
    stream_options: Option<StreamOptions>,
    /// Number of choices; only 1 is supported.
    #[schemars(range(min = 1, max = 1))]
    n: Option<u32>,
    /// Prepend the prompt to the completion.
    echo: Option<bool>,
}

/// One input item of the Responses API: a message.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ResponsesInputItem {
    /// `message` (the default), `function_call` (a call the model made earlier) or
    /// `function_call_output` (its result); other item types are refused with 400.
    #[serde(rename = "type", default)]
    kind: Option<String>,
    /// Messages: who wrote it, `system`, `developer`, `user` or `assistant`.
    role: Option<MessageRole>,
    /// Messages: a string or a list of `input_text` / `output_text` parts.
    #[serde(default)]
    content: Option<MessageContent>,
    /// `function_call`: the called function.
    name: Option<String>,
    /// `function_call`: its arguments, a JSON string.
    arguments: Option<String>,
    /// `function_call` and `function_call_output`: the call's id.
    #[allow(dead_code)]
    call_id: Option<String>,
    /// `function_call_output`: the function's result.
    output: Option<String>,
}

/// The input of a response.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Messages.
    Items(Vec<ResponsesInputItem>),
}

/// Body of `POST /v1/responses` (OpenAI Responses API). Fields not listed here are
/// accepted and ignored.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct ResponsesRequest {
    /// The configured model's name.
    #[schemars(required)]
    model: Option<String>,
    /// A string (one user message) or a list of messages. Models whose
    /// `capabilities.multi_turn` is false accept at most one user message.
    #[schemars(required)]
    input: Option<ResponsesInput>,
    /// A system prompt placed before the input.
    instructions: Option<String>,
    /// Most tokens to generate.
    #[schemars(range(min = 1))]
    max_output_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2.
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f64>,
    /// Nucleus sampling mass, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f64>,
    /// Answer with server-sent Responses API events (`response.created`,
    /// `response.output_text.delta`, …, `response.completed`).
    stream: Option<bool>,
    /// Request-level thinking mode; must be one of the model's `capabilities.thinking_modes`,
    /// else 400 `thinking_unsupported`.
    thinking: Option<ThinkingMode>,
    /// TranslateGemma: the source language code; omit it, or use `auto` / `mixed`, for
    /// mixed-source input.
    source_lang_code: Option<String>,
    /// TranslateGemma: the target language code.
    target_lang_code: Option<String>,
    /// Functions the model may call (`[{"type": "function", "name", "description",
    /// "parameters"}]`); calls come back as `function_call` output items.
    tools: Option<Vec<ResponsesTool>>,
    /// `auto` (default with tools), `required`, `none`, or `{"type": "function", "name": …}`.
    tool_choice: Option<ToolChoiceIn>,
    /// `{"format": {"type": "json_schema", "name": …, "schema": {…}}}` or `{"format":
    /// {"type": "json_object"}}`: structured output, enforced by constrained decoding.
    text: Option<ResponsesText>,
}

/// Embedding input: one string or a list of strings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts, embedded in order.
    Texts(Vec<String>),
    /// Anything else (token arrays): refused with 400.
    #[schemars(skip)]
    Other(Value),
}

/// How embedding vectors are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EncodingFormat {
    /// Arrays of numbers.
    #[default]
    Float,
    /// Base64 of the little-endian `f32` bytes.
    Base64,
}

/// Body of `POST /v1/embeddings` (OpenAI's shape). Fields not listed here are accepted and
/// ignored.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct EmbeddingsRequest {
    /// The configured embedding model's name.
    #[schemars(required)]
    model: Option<String>,
    /// A string or a non-empty list of strings. Token arrays are refused.
    #[schemars(required)]
    input: Option<EmbeddingInput>,
    /// `float` (default) or `base64`.
    encoding_format: Option<EncodingFormat>,
}

/// A document to rerank: a string, or an object with `text`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum RerankDocument {
    /// The document's text.
    Text(String),
    /// An object holding the document's text.
    Object {
        /// The document's text.
        text: String,
    },
}

impl RerankDocument {
    fn into_text(self) -> String {
        match self {
            Self::Text(text) | Self::Object { text } => text,
        }
    }
}

/// Body of `POST /v1/rerank`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(crate) struct RerankBody {
    /// The configured reranking model's name.
    #[schemars(required)]
    model: Option<String>,
    /// The query documents are scored against.
    #[schemars(required)]
    query: Option<String>,
    /// The candidate documents; must not be empty.
    #[schemars(required, length(min = 1))]
    documents: Option<Vec<RerankDocument>>,
    /// Return only the best `top_n` results; all when absent.
    #[schemars(range(min = 1))]
    top_n: Option<u32>,
    /// Include each result's document text (`document.text`). Default false.
    return_documents: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, "chat_completions");
    let reply = chat(&ctx, &mut rec).await;
    rec.finish(reply)
}

/// `POST /v1/completions`.
pub(crate) async fn completions(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, "completions");
    let reply = completion(&ctx, &mut rec).await;
    rec.finish(reply)
}

/// `POST /v1/responses`.
pub(crate) async fn responses(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, "responses");
    let reply = response(&ctx, &mut rec).await;
    rec.finish(reply)
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, "embeddings");
    let reply = embed(&ctx, &mut rec).await;
    rec.finish(reply)
}

/// `POST /v1/rerank`.
pub(crate) async fn rerank(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, "rerank");
    let reply = rerank_documents(&ctx, &mut rec).await;
    rec.finish(reply)
}

/// `GET /v1/models`.
pub(crate) async fn list_models(ctx: Ctx) -> Result<Response, ApiError> {
    let created = boot_time(&ctx.state);
    let data: Vec<Value> =
        ctx.state.manager.models().iter().map(|m| model_object(m, created)).collect();
    Ok(json_response(StatusCode::OK, &json!({ "object": "list", "data": data })))
}

/// `GET /v1/models/{name}`.
pub(crate) async fn get_model(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.model(ctx.name())?;
    Ok(json_response(StatusCode::OK, &model_object(&snapshot, boot_time(&ctx.state))))
}

fn model_object(m: &ModelSnapshot, created: u64) -> Value {
    json!({
        "id": m.name,
        "object": "model",
        "created": created,
        "owned_by": "hangar",
        "runtime_state": m.runtime_state.as_str(),
        "type": m.model_type,
    })
}

async fn chat(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let body: ChatCompletionRequest = parse_json(&ctx.body, false)?;
    let model = require_model(body.model)?;
    rec.set_model(&model);
    check_n(body.n)?;
    let messages = body.messages.unwrap_or_default();
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must be a non-empty array"));
    }
    let messages = messages
        .into_iter()
        .map(|m| {
            let mut message = ChatMessage::new(m.role.into(), content_text(m.content)?);
            for call in m.tool_calls.unwrap_or_default() {
                message.tool_calls.push(call.into_call()?);
            }
            Ok(message)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let (tools, format) = tools::chat_output(body.tools, body.tool_choice, body.response_format)?;
    let (max_tokens, max_name) = match (body.max_completion_tokens, body.max_tokens) {
        (Some(n), _) => (Some(n), "max_completion_tokens"),
        (None, n) => (n, "max_tokens"),
    };
    let params = sampling(
        (max_tokens, max_name),
        body.temperature,
        body.top_p,
        body.top_k,
        body.seed,
        body.stop,
    )?;
    let user_turns = messages.iter().filter(|m| m.role == Role::User).count();
    let thinking = body.thinking.unwrap_or_default();
    let request = GenerateRequest {
        prompt: Prompt::Chat(messages),
        params,
        thinking,
        translation: None,
        tools,
        format,
    };
    let guard = admit(&ctx.state, &model, thinking, user_turns).await?;
    let (id, created) = (new_id("chatcmpl-"), unix_now());
    if body.stream.unwrap_or(false) {
        let include_usage = body.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        let format = ChatStream { id, created, model, include_usage, calls: 0 };
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, calls, summary } = generate_all(guard, request, rec).await?;
    let mut message = json!({ "role": "assistant", "content": text, "refusal": null });
    if !calls.is_empty() {
        if text.is_empty() {
            message["content"] = Value::Null;
        }
        let calls: Vec<Value> =
            calls.iter().map(|c| tools::chat_tool_call(&new_id("call_"), c, None)).collect();
        message["tool_calls"] = calls.into();
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(summary.finish_reason),
        }],
        "usage": usage(&summary),
    });
    Ok(Reply::Done(json_response(StatusCode::OK, &body)))
}

async fn completion(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let body: CompletionRequest = parse_json(&ctx.body, false)?;
    let model = require_model(body.model)?;
    rec.set_model(&model);
    check_n(body.n)?;
    let prompt = match body.prompt {
        Some(CompletionPrompt::Text(text)) => text,
        Some(CompletionPrompt::Texts(mut texts)) if texts.len() == 1 => texts.remove(0),
        Some(CompletionPrompt::Texts(texts)) => {
            return Err(ApiError::bad_request(format!(
                "`prompt` must hold exactly one string (batches are not supported), got {}",
                texts.len()
            )));
        }
        Some(CompletionPrompt::Other(value)) => {
            return Err(ApiError::bad_request(format!(
                "`prompt` must be a string or an array of one string, got {}; token arrays are not supported",
                shape(&value)
            )));
        }
        None => return Err(ApiError::bad_request("`prompt` is required")),
    };
    let params = sampling(
        (body.max_tokens, "max_tokens"),
        body.temperature,
        body.top_p,
        body.top_k,
        body.seed,
        body.stop,
    )?;
    let echo = body.echo.unwrap_or(false).then(|| prompt.clone());
    let request = GenerateRequest { params, ..GenerateRequest::new(Prompt::Text(prompt)) };
    let guard = admit(&ctx.state, &model, ThinkingMode::Default, 1).await?;
    let (id, created) = (new_id("cmpl-"), unix_now());
    if body.stream.unwrap_or(false) {
        let include_usage = body.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        let format = CompletionStream { id, created, model, include_usage, echo };
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, summary, .. } = generate_all(guard, request, rec).await?;
    let text = match echo {
        Some(prompt) => prompt + &text,
        None => text,
    };
    let body = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish_reason(summary.finish_reason),
        }],
        "usage": usage(&summary),
    });
    Ok(Reply::Done(json_response(StatusCode::OK, &body)))
}

async fn response(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let body: ResponsesRequest = parse_json(&ctx.body, false)?;
    let model = require_model(body.model)?;
    rec.set_model(&model);
    let mut messages = Vec::new();
    if let Some(instructions) = body.instructions.clone().filter(|s| !s.is_empty()) {
        messages.push(ChatMessage::new(Role::System, instructions));
    }
    match body.input {
        Some(ResponsesInput::Text(text)) => {
            messages.push(ChatMessage::new(Role::User, text));
        }
        Some(ResponsesInput::Items(items)) => {
            if items.is_empty() {
                return Err(ApiError::bad_request("`input` must not be an empty array"));
            }
            for (i, item) in items.into_iter().enumerate() {
                input_item(&mut messages, i, item)?;
            }
        }
        None => return Err(ApiError::bad_request("`input` is required")),
    }
    for (name, code) in
        [("source_lang_code", &body.source_lang_code), ("target_lang_code", &body.target_lang_code)]
    {
        if code.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(ApiError::bad_request(format!("`{name}` must not be empty")));
        }
    }
    let tools_echo: Value = body
        .tools
        .as_ref()
        .map_or_else(Vec::new, |tools| tools.iter().map(ResponsesTool::echo).collect())
        .into();
    let choice_echo = body.tool_choice.as_ref().map_or_else(|| json!("auto"), ToolChoiceIn::echo);
    let (tools, format) = tools::responses_output(body.tools, body.tool_choice, body.text)?;
    let text_echo = match &format {
        None => json!({ "format": { "type": "text" } }),
        Some(hangar_backend::OutputFormat::JsonObject) => {
            json!({ "format": { "type": "json_object" } })
        }
        Some(hangar_backend::OutputFormat::JsonSchema(schema)) => {
            json!({ "format": { "type": "json_schema", "schema": schema } })
        }
    };
    let params = sampling(
        (body.max_output_tokens, "max_output_tokens"),
        body.temperature,
        body.top_p,
        None,
        None,
        None,
    )?;
    let user_turns = messages.iter().filter(|m| m.role == Role::User).count();
    let thinking = body.thinking.unwrap_or_default();
    let translation = match (body.source_lang_code, body.target_lang_code) {
        (None, None) => None,
        (source, Some(target)) => {
            Some(Translation { source_lang_code: source, target_lang_code: target })
        }
        (Some(_), None) => {
            return Err(ApiError::bad_request(
                "`target_lang_code` is required with `source_lang_code` (omit the source, or set it to \"auto\", for mixed-source input)",
            ));
        }
    };
    let request = GenerateRequest {
        prompt: Prompt::Chat(messages),
        params,
        thinking,
        translation,
        tools,
        format,
    };
    let guard = admit(&ctx.state, &model, thinking, user_turns).await?;
    let meta = ResponseMeta {
        id: new_id("resp_"),
        message_id: new_id("msg_"),
        created_at: unix_now(),
        model,
        instructions: body.instructions,
        max_output_tokens: body.max_output_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        tools: tools_echo,
        tool_choice: choice_echo,
        text: text_echo,
    };
    if body.stream.unwrap_or(false) {
        let format = ResponsesStream {
            meta,
            sequence: 0,
            text: String::new(),
            message_open: false,
            calls: Vec::new(),
        };
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, calls, summary } = generate_all(guard, request, rec).await?;
    let calls: Vec<(String, ToolCall)> = calls.into_iter().map(|c| (new_id("call_"), c)).collect();
    let with_message = !text.is_empty() || calls.is_empty();
    let response = meta.finished(&text, with_message, &calls, &summary);
    Ok(Reply::Done(json_response(StatusCode::OK, &response)))
}

/// Adds one Responses API input item to the chat: a message, a `function_call` (an assistant
/// tool call, merged into the preceding assistant turn) or a `function_call_output`.
fn input_item(
    messages: &mut Vec<ChatMessage>,
    i: usize,
    item: ResponsesInputItem,
) -> Result<(), ApiError> {
    let required =
        |field: &str| ApiError::bad_request(format!("input[{i}]: `{field}` is required"));
    match item.kind.as_deref().unwrap_or("message") {
        "message" => {
            let role = item.role.ok_or_else(|| required("role"))?;
            messages.push(ChatMessage::new(role.into(), content_text(item.content)?));
        }
        "function_call" => {
            let name = item.name.ok_or_else(|| required("name"))?;
            let arguments = item.arguments.ok_or_else(|| required("arguments"))?;
            let call = ToolCall { name, arguments };
            match messages.last_mut() {
                Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
                _ => {
                    let mut message = ChatMessage::new(Role::Assistant, "");
                    message.tool_calls.push(call);
                    messages.push(message);
                }
            }
        }
        "function_call_output" => {
            let output = item.output.ok_or_else(|| required("output"))?;
            messages.push(ChatMessage::new(Role::Tool, output));
        }
        kind => {
            return Err(ApiError::bad_request(format!(
                "input[{i}]: items of type `{kind}` are not supported; send `message`, \
                 `function_call` or `function_call_output` items"
            )));
        }
    }
    Ok(())
}

async fn embed(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let body: EmbeddingsRequest = parse_json(&ctx.body, false)?;
    let model = require_model(body.model)?;
    rec.set_model(&model);
    let inputs = match body.input {
        Some(EmbeddingInput::Text(text)) => vec![text],
        Some(EmbeddingInput::Texts(texts)) if !texts.is_empty() => texts,
        Some(EmbeddingInput::Texts(_)) => {
            return Err(ApiError::bad_request("`input` must not be an empty array"));
        }
        Some(EmbeddingInput::Other(value)) => {
            return Err(ApiError::bad_request(format!(
                "`input` must be a string or an array of strings, got {}; token arrays are not supported",
                shape(&value)
            )));
        }
        None => return Err(ApiError::bad_request("`input` is required")),
    };
    let format = body.encoding_format.unwrap_or_default();
    let guard = ctx.state.manager.acquire(&model).await?;
    let result = guard.runtime().embed(EmbedRequest { inputs }).await;
    let embeddings = guard.check(result)?;
    drop(guard);
    let data: Vec<Value> = embeddings
        .vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match format {
                EncodingFormat::Float => json!(vector),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64(&bytes))
                }
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": { "prompt_tokens": embeddings.prompt_tokens, "total_tokens": embeddings.prompt_tokens },
    });
    Ok(Reply::Done(json_response(StatusCode::OK, &body)))
}

async fn rerank_documents(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let body: RerankBody = parse_json(&ctx.body, false)?;
    let model = require_model(body.model)?;
    rec.set_model(&model);
    let query = body.query.ok_or_else(|| ApiError::bad_request("`query` is required"))?;
    let documents: Vec<String> =
        body.documents.unwrap_or_default().into_iter().map(RerankDocument::into_text).collect();
    if documents.is_empty() {
        return Err(ApiError::bad_request("`documents` must be a non-empty array"));
    }
    if body.top_n == Some(0) {
        return Err(ApiError::bad_request("`top_n` must be at least 1"));
    }
    let guard = ctx.state.manager.acquire(&model).await?;
    let result =
        guard.runtime().rerank(RerankRequest { query, documents: documents.clone() }).await;
    let rerankings = guard.check(result)?;
    drop(guard);
    if rerankings.scores.len() != documents.len() {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "runtime_error",
            format!(
                "the runtime returned {} scores for {} documents",
                rerankings.scores.len(),
                documents.len()
            ),
        ));
    }
    let mut order: Vec<usize> = (0..documents.len()).collect();
    order.sort_by(|&a, &b| rerankings.scores[b].total_cmp(&rerankings.scores[a]));
    order.truncate(body.top_n.map_or(usize::MAX, |n| n as usize));
    let return_documents = body.return_documents.unwrap_or(false);
    let results: Vec<Value> = order
        .into_iter()
        .map(|index| {
            let mut result = json!({ "index": index, "relevance_score": rerankings.scores[index] });
            if return_documents {
                result["document"] = json!({ "text": documents[index] });
            }
            result
        })
        .collect();
    let body = json!({
        "id": new_id("rerank-"),
        "model": model,
        "results": results,
        "usage": { "prompt_tokens": rerankings.prompt_tokens, "total_tokens": rerankings.prompt_tokens },
    });
    Ok(Reply::Done(json_response(StatusCode::OK, &body)))
}

// ---------------------------------------------------------------------------------------
// Validation and admission
// ---------------------------------------------------------------------------------------

fn require_model(model: Option<String>) -> Result<String, ApiError> {
    match model {
        Some(model) if !model.trim().is_empty() => Ok(model),
        _ => Err(ApiError::bad_request("`model` is required")),
    }
}

fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_request(format!(
            "`n` must be 1 (got {n}); only one choice is supported"
        ))),
    }
}

/// The text of a message's content: a string, or its text parts joined by newlines.
fn content_text(content: Option<MessageContent>) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(MessageContent::Text(text)) => Ok(text),
        Some(MessageContent::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text" | "input_text" | "output_text", Some(text)) => texts.push(text),
                    ("text" | "input_text" | "output_text", None) => {
                        return Err(ApiError::bad_request(format!(
                            "a content part of type `{}` needs `text`",
                            part.kind
                        )));
                    }
                    (kind, _) => {
                        return Err(ApiError::bad_request(format!(
                            "content parts of type `{kind}` are not supported; only text parts are"
                        )));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

/// Sampling parameters, checked. `max_tokens` comes with the name the request used.
fn sampling(
    (max_tokens, max_name): (Option<u32>, &str),
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u32>,
    seed: Option<u64>,
    stop: Option<StopSequences>,
) -> Result<SamplingParams, ApiError> {
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(format!("`{max_name}` must be at least 1")));
    }
    if let Some(t) = temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(ApiError::bad_request(format!(
            "`temperature` must be between 0 and 2, got {t}"
        )));
    }
    if let Some(p) = top_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(ApiError::bad_request(format!("`top_p` must be between 0 and 1, got {p}")));
    }
    let stop = match stop {
        None => Vec::new(),
        Some(StopSequences::One(s)) => vec![s],
        Some(StopSequences::Many(v)) => v,
    };
    Ok(SamplingParams {
        max_tokens,
        temperature: temperature.map(|t| t as f32),
        top_p: top_p.map(|p| p as f32),
        top_k,
        seed,
        stop,
    })
}

/// Checks a generation against the model's capabilities, then admits it.
async fn admit(
    state: &AppState,
    model: &str,
    thinking: ThinkingMode,
    user_turns: usize,
) -> Result<RequestGuard, ApiError> {
    let snapshot = state.manager.model(model)?;
    check_capabilities(&snapshot, thinking, user_turns)?;
    Ok(state.manager.acquire(model).await?)
}

fn check_capabilities(
    snapshot: &ModelSnapshot,
    thinking: ThinkingMode,
    user_turns: usize,
) -> Result<(), ApiError> {
    let caps = &snapshot.capabilities;
    if thinking != ThinkingMode::Default && !caps.thinking_modes.contains(&thinking) {
        let modes: Vec<&str> = caps.thinking_modes.iter().map(|m| thinking_str(*m)).collect();
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::THINKING_UNSUPPORTED,
            format!(
                "model `{}` does not support thinking `{}`; its thinking_modes are [{}]",
                snapshot.name,
                thinking_str(thinking),
                modes.join(", ")
            ),
        ));
    }
    if !caps.multi_turn && user_turns > 1 {
        return Err(ApiError::bad_request(format!(
            "model `{}` is single-turn (capabilities.multi_turn is false): send one user message, got {user_turns}",
            snapshot.name
        )));
    }
    Ok(())
}

const fn thinking_str(mode: ThinkingMode) -> &'static str {
    match mode {
        ThinkingMode::Default => "default",
        ThinkingMode::Enabled => "enabled",
        ThinkingMode::Disabled => "disabled",
    }
}

// ---------------------------------------------------------------------------------------
// Running generations
// ---------------------------------------------------------------------------------------

/// A finished generation: its text, tool calls and summary.
struct Generated {
    text: String,
    calls: Vec<ToolCall>,
    summary: GenerateSummary,
}

/// Runs a generation to its end.
async fn generate_all(
    guard: RequestGuard,
    request: GenerateRequest,
    rec: &Recorder,
) -> Result<Generated, ApiError> {
    let (tx, mut rx) = mpsc::channel(64);
    let start = Instant::now();
    let collect = async move {
        let (mut text, mut calls, mut first) = (String::new(), Vec::new(), None);
        while let Some(event) = rx.recv().await {
            first.get_or_insert_with(Instant::now);
            match event {
                GenerateEvent::Text(piece) => text.push_str(&piece),
                GenerateEvent::ToolCall(call) => calls.push(call),
            }
        }
        (text, calls, first)
    };
    let (result, (text, calls, first)) =
        tokio::join!(guard.runtime().generate(request, tx), collect);
    let summary = guard.check(result)?;
    rec.generation(&summary, start, first);
    Ok(Generated { text, calls, summary })
}

/// How a stream's events are written, per API.
trait StreamFormat: Send + 'static {
    /// Events sent before generation starts.
    fn start(&mut self) -> Vec<Bytes>;
    /// Events for one piece of generated text.
    fn delta(&mut self, text: &str) -> Vec<Bytes>;
    /// Events for one complete tool call (only requests with tools get them).
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes>;
    /// Events after the generation finished.
    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes>;
    /// Events after the generation failed.
    fn fail(&mut self, error: &ApiError) -> Vec<Bytes>;
}

/// How a streamed generation opened: its first event, its end before any event, or the
/// client going away first.
enum Opening {
    Event(GenerateEvent),
    /// The event channel closed: the generation has ended (its result is still to be read).
    Closed,
    Ended(Result<GenerateSummary, RuntimeError>),
    ClientGone,
}

/// Starts a streamed generation in a spawned task and answers once it has produced its first
/// event: then with 200 and an SSE stream that the task feeds. A generation that fails before
/// producing anything (a prompt longer than the context, a schema the engine cannot use, a
/// feature the model lacks) is answered like a non-streamed one, with its status and a JSON
/// error. The task owns the request's guard: when the client disconnects, forwarding stops
/// and drops the generation's receiver, the backend cancels, and the guard (the slot) is
/// released.
async fn stream_generation(
    guard: RequestGuard,
    request: GenerateRequest,
    mut format: impl StreamFormat,
    rec: Recorder,
) -> Result<Response, ApiError> {
    let (response, sse) = sse_response();
    let (mut ready, opened) = oneshot::channel::<Result<(), ApiError>>();
    tokio::spawn(async move {
        let (tx, mut rx) = mpsc::channel(64);
        let start = Instant::now();
        let runtime = Arc::clone(guard.runtime());
        let generation = runtime.generate(request, tx);
        tokio::pin!(generation);
        let opening = tokio::select! {
            event = rx.recv() => event.map_or(Opening::Closed, Opening::Event),
            result = &mut generation => Opening::Ended(result),
            () = ready.closed() => Opening::ClientGone,
        };
        let (first_event, ended) = match opening {
            Opening::Event(event) => (Some(event), None),
            Opening::Closed => (None, Some((&mut generation).await)),
            Opening::Ended(result) => (None, Some(result)),
            Opening::ClientGone => {
                drop(rx);
                let result = guard.check((&mut generation).await).map_err(ApiError::from);
                rec.record(result.as_ref().err().map_or("ok", |e| e.code));
                return;
            }
        };
        let ended = ended.map(|result| guard.check(result).map_err(ApiError::from));
        if let Some(Err(e)) = ended.as_ref()
            && rx.is_empty()
        {
            // Nothing was generated: the error is the answer (the handler records it).
            if let Err(Err(e)) = ready.send(Err(e.clone())) {
                rec.record(e.code);
            }
            return;
        }
        let mut connected = ready.send(Ok(())).is_ok() && send_all(&sse, format.start()).await;
        let mut first = None;
        if let Some(event) = first_event {
            first = Some(Instant::now());
            connected = connected && send_all(&sse, event_bytes(&mut format, event)).await;
        }
        let result = match ended {
            Some(result) => {
                connected = forward(rx, &sse, &mut format, connected, &mut first).await;
                result
            }
            None => {
                let forward = forward(rx, &sse, &mut format, connected, &mut first);
                let (result, still) = tokio::join!(&mut generation, forward);
                connected = still;
                guard.check(result).map_err(ApiError::from)
            }
        };
        if let Ok(summary) = &result {
            rec.generation(summary, start, first);
        }
        rec.record(result.as_ref().err().map_or("ok", |e| e.code));
        drop(guard);
        if !connected {
            tracing::debug!(model = %rec.model, "stream client went away; generation cancelled");
            return;
        }
        let tail = match &result {
            Ok(summary) => format.finish(summary),
            Err(e) => format.fail(e),
        };
        send_all(&sse, tail).await;
    });
    match opened.await {
        Ok(Ok(())) => Ok(response),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "runtime_error",
            "the generation ended without an answer",
        )),
    }
}

/// The stream events of one generation event.
fn event_bytes(format: &mut impl StreamFormat, event: GenerateEvent) -> Vec<Bytes> {
    match event {
        GenerateEvent::Text(text) => format.delta(&text),
        GenerateEvent::ToolCall(call) => format.tool_call(call),
    }
}

/// Forwards generated text to the client until the generation ends (`true`) or the client
/// goes away (`false`). Returning drops `rx`, which tells the backend to stop.
async fn forward(
    mut rx: mpsc::Receiver<GenerateEvent>,
    sse: &mpsc::Sender<Bytes>,
    format: &mut impl StreamFormat,
    connected: bool,
    first: &mut Option<Instant>,
) -> bool {
    if !connected {
        return false;
    }
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => {
                    first.get_or_insert_with(Instant::now);
                    if !send_all(sse, event_bytes(format, event)).await {
                        return false;
                    }
                }
                None => return true,
            },
            () = sse.closed() => return false,
        }
    }
}

/// Sends events in order; `false` once the client is gone.
async fn send_all(sse: &mpsc::Sender<Bytes>, events: Vec<Bytes>) -> bool {
    for event in events {
        if sse.send(event).await.is_err() {
            return false;
        }
    }
    true
}

fn done_event() -> Bytes {
    sse_event("[DONE]")
}

/// The error envelope's `{"error": {…}}` as a JSON value.
fn error_value(e: &ApiError) -> Value {
    let mut error = Map::new();
    error.insert("code".into(), e.code.into());
    error.insert("message".into(), e.message.clone().into());
    error.extend(e.extra.clone());
    json!({ "error": error })
}

/// `chat.completion.chunk` events.
struct ChatStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Tool calls sent so far (the next call's `index`).
    calls: usize,
}

impl ChatStream {
    fn chunk(&self, choices: Value, usage: Value) -> Bytes {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = usage;
        }
        sse_event(&chunk.to_string())
    }

    fn choice(delta: Value, finish: Option<FinishReason>) -> Value {
        json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish.map(finish_reason) }])
    }
}

impl StreamFormat for ChatStream {
    fn start(&mut self) -> Vec<Bytes> {
        vec![
            self.chunk(
                Self::choice(json!({ "role": "assistant", "content": "" }), None),
                Value::Null,
            ),
        ]
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        vec![self.chunk(Self::choice(json!({ "content": text }), None), Value::Null)]
    }

    /// The whole call in one delta (`id`, `type`, name and complete arguments).
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes> {
        let entry = tools::chat_tool_call(&new_id("call_"), &call, Some(self.calls));
        self.calls += 1;
        vec![self.chunk(Self::choice(json!({ "tool_calls": [entry] }), None), Value::Null)]
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut events =
            vec![self.chunk(Self::choice(json!({}), Some(summary.finish_reason)), Value::Null)];
        if self.include_usage {
            events.push(self.chunk(json!([]), usage(summary)));
        }
        events.push(done_event());
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![sse_event(&error_value(error).to_string()), done_event()]
    }
}

/// `text_completion` chunk events.
struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// The prompt, to send first when `echo` is set.
    echo: Option<String>,
}

impl CompletionStream {
    fn chunk(&self, choices: Value, usage: Value) -> Bytes {
        let mut chunk = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = usage;
        }
        sse_event(&chunk.to_string())
    }

    fn choice(text: &str, finish: Option<FinishReason>) -> Value {
        json!([{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish.map(finish_reason) }])
    }
}

impl StreamFormat for CompletionStream {
    fn start(&mut self) -> Vec<Bytes> {
        match self.echo.take() {
            Some(prompt) => vec![self.chunk(Self::choice(&prompt, None), Value::Null)],
            None => Vec::new(),
        }
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        vec![self.chunk(Self::choice(text, None), Value::Null)]
    }

    /// Completions have no tools, so engines never send calls here.
    fn tool_call(&mut self, _call: ToolCall) -> Vec<Bytes> {
        Vec::new()
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut events =
            vec![self.chunk(Self::choice("", Some(summary.finish_reason)), Value::Null)];
        if self.include_usage {
            events.push(self.chunk(json!([]), usage(summary)));
        }
        events.push(done_event());
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![sse_event(&error_value(error).to_string()), done_event()]
    }
}

/// What a Responses API response object repeats from its request.
struct ResponseMeta {
    id: String,
    message_id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    tools: Value,
    tool_choice: Value,
    text: Value,
}

impl ResponseMeta {
    fn object(
        &self,
        status: &str,
        output: Value,
        usage: Value,
        error: Value,
        incomplete: Value,
    ) -> Value {
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "temperature": self.temperature,
            "text": self.text,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "usage": usage,
            "metadata": {},
        })
    }

    fn message(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(output_text).into_iter().collect();
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// The object of a response that was created and has not finished.
    fn in_progress(&self) -> Value {
        self.object("in_progress", json!([]), Value::Null, Value::Null, Value::Null)
    }

    /// The object of a finished response: `completed`, or `incomplete` when
    /// `max_output_tokens` cut it short. Its output is the message (when `with_message`)
    /// followed by one `function_call` item per call (with its `call_id`).
    fn finished(
        &self,
        text: &str,
        with_message: bool,
        calls: &[(String, ToolCall)],
        summary: &GenerateSummary,
    ) -> Value {
        let (status, incomplete) = match summary.finish_reason {
            FinishReason::Stop | FinishReason::ToolCalls => ("completed", Value::Null),
            FinishReason::Length => ("incomplete", json!({ "reason": "max_output_tokens" })),
        };
        let usage = json!({
            "input_tokens": summary.prompt_tokens,
            "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": summary.completion_tokens,
            "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": summary.prompt_tokens.saturating_add(summary.completion_tokens),
        });
        let mut output: Vec<Value> = Vec::new();
        if with_message {
            output.push(self.message(status, Some(text)));
        }
        output.extend(calls.iter().map(|(call_id, call)| {
            tools::function_call_item(&function_item_id(call_id), call_id, call, "completed")
        }));
        let mut object = self.object(status, output.into(), usage, Value::Null, incomplete);
        object["output_text"] = text.into();
        object
    }
}

/// The item id of the `function_call` with `call_id`.
fn function_item_id(call_id: &str) -> String {
    format!("fc_{}", call_id.trim_start_matches("call_"))
}

fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [] })
}

/// Responses API streaming events (`event:` lines with the type, `data:` with the event).
/// The message item is opened by the first text (or at the end when there was neither text
/// nor a call), so a pure tool call streams only its `function_call` item.
struct ResponsesStream {
    meta: ResponseMeta,
    sequence: u64,
    text: String,
    /// Whether the message item was announced (it is output item 0 then).
    message_open: bool,
    /// Calls streamed so far, with their `call_id`s.
    calls: Vec<(String, ToolCall)>,
}

impl ResponsesStream {
    fn event(&mut self, kind: &str, fields: Value) -> Bytes {
        let mut data = json!({ "type": kind, "sequence_number": self.sequence });
        if let (Some(data), Value::Object(fields)) = (data.as_object_mut(), fields) {
            data.extend(fields);
        }
        self.sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    }

    fn part_fields(&self, part: Value) -> Value {
        json!({ "item_id": self.meta.message_id, "output_index": 0, "content_index": 0, "part": part })
    }

    /// Announces the message item and its text part.
    fn open_message(&mut self) -> Vec<Bytes> {
        self.message_open = true;
        let item = self.meta.message("in_progress", None);
        let part = self.part_fields(output_text(""));
        vec![
            self.event("response.output_item.added", json!({ "output_index": 0, "item": item })),
            self.event("response.content_part.added", part),
        ]
    }
}

impl StreamFormat for ResponsesStream {
    fn start(&mut self) -> Vec<Bytes> {
        let response = self.meta.in_progress();
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
        ]
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        let mut events = if self.message_open { Vec::new() } else { self.open_message() };
        self.text.push_str(text);
        let fields = json!({
            "item_id": self.meta.message_id,
            "output_index": 0,
            "content_index": 0,
            "delta": text,
            "logprobs": [],
        });
        events.push(self.event("response.output_text.delta", fields));
        events
    }

    /// `output_item.added`, the arguments in one delta, `arguments.done`, `output_item.done`.
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes> {
        let output_index = usize::from(self.message_open) + self.calls.len();
        let call_id = new_id("call_");
        let item_id = function_item_id(&call_id);
        let pending = ToolCall { name: call.name.clone(), arguments: String::new() };
        let added = tools::function_call_item(&item_id, &call_id, &pending, "in_progress");
        let done = tools::function_call_item(&item_id, &call_id, &call, "completed");
        let events = vec![
            self.event(
                "response.output_item.added",
                json!({ "output_index": output_index, "item": added }),
            ),
            self.event(
                "response.function_call_arguments.delta",
                json!({ "item_id": item_id, "output_index": output_index, "delta": call.arguments }),
            ),
            self.event(
                "response.function_call_arguments.done",
                json!({ "item_id": item_id, "output_index": output_index, "arguments": call.arguments }),
            ),
            self.event(
                "response.output_item.done",
                json!({ "output_index": output_index, "item": done }),
            ),
        ];
        self.calls.push((call_id, call));
        events
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut events = Vec::new();
        if !self.message_open && self.calls.is_empty() {
            events.extend(self.open_message());
        }
        let text = std::mem::take(&mut self.text);
        let calls = std::mem::take(&mut self.calls);
        let response = self.meta.finished(&text, self.message_open, &calls, summary);
        let status = response["status"].as_str().unwrap_or("completed").to_owned();
        if self.message_open {
            let done = json!({
                "item_id": self.meta.message_id,
                "output_index": 0,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            });
            let part = self.part_fields(output_text(&text));
            let item = self.meta.message(&status, Some(&text));
            events.push(self.event("response.output_text.done", done));
            events.push(self.event("response.content_part.done", part));
            events.push(
                self.event("response.output_item.done", json!({ "output_index": 0, "item": item })),
            );
        }
        let last = if status == "completed" { "response.completed" } else { "response.incomplete" };
        events.push(self.event(last, json!({ "response": response })));
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        let error = json!({ "code": error.code, "message": error.message });
        let response = self.meta.object("failed", json!([]), Value::Null, error, Value::Null);
        vec![self.event("response.failed", json!({ "response": response }))]
    }
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

/// What a handler produced: a complete response, or a stream that records its own metrics
/// when it ends.
enum Reply {
    Done(Response),
    Streaming(Response),
}

/// Records one inference request in the request metrics.
#[derive(Clone)]
struct Recorder {
    state: Arc<AppState>,
    endpoint: &'static str,
    model: String,
    start: Instant,
}

impl Recorder {
    fn new(state: &Arc<AppState>, endpoint: &'static str) -> Self {
        Self {
            state: Arc::clone(state),
            endpoint,
            model: UNKNOWN_MODEL_LABEL.to_owned(),
            start: Instant::now(),
        }
    }

    /// Labels the request with `name` when it is a configured model.
    fn set_model(&mut self, name: &str) {
        if self.state.manager.model(name).is_ok() {
            name.clone_into(&mut self.model);
        }
    }

    fn record(&self, outcome: &str) {
        self.state.metrics.record(self.endpoint, &self.model, outcome, self.start.elapsed());
    }

    /// Keeps the statistics of a finished generation for `GET /api/v1/stats`.
    fn generation(&self, summary: &GenerateSummary, start: Instant, first: Option<Instant>) {
        let now = Instant::now();
        let decode_tokens = summary.completion_tokens.saturating_sub(1);
        let tokens_per_second = first.and_then(|f| {
            let secs = now.duration_since(f).as_secs_f64();
            (decode_tokens > 0 && secs > 0.0).then(|| f64::from(decode_tokens) / secs)
        });
        let stats = crate::state::GenerationStats {
            model: self.model.clone(),
            endpoint: self.endpoint,
            time_to_first_token: first.map(|f| f.duration_since(start).as_secs_f64()),
            tokens_per_second,
            input_tokens: summary.prompt_tokens,
            output_tokens: summary.completion_tokens,
            finished_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        *self.state.last_generation.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
    }

    /// Records a request that ended now (streams record themselves) and passes it on.
    fn finish(self, reply: Result<Reply, ApiError>) -> Result<Response, ApiError> {
        match reply {
            Ok(Reply::Done(response)) => {
                self.record("ok");
                Ok(response)
            }
            Ok(Reply::Streaming(response)) => Ok(response),
            Err(e) => {
                self.record(e.code);
                Err(e)
            }
        }
    }
}

/// A value's JSON kind, and its first element's for arrays ("an array of a number").
fn shape(value: &Value) -> String {
    match value.as_array().and_then(|a| a.first()) {
        Some(first) => format!("an array of {}", hangar_config::json_kind(first)),
        None => hangar_config::json_kind(value).to_owned(),
    }
}

const fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
    }
}

fn usage(summary: &GenerateSummary) -> Value {
    json!({
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "total_tokens": summary.prompt_tokens.saturating_add(summary.completion_tokens),
    })
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// When the service started, in Unix seconds (the `created` of models).
fn boot_time(state: &AppState) -> u64 {
    unix_now().saturating_sub(state.started.elapsed().as_secs())
}

/// A unique id with `prefix`: the current time and a process-wide counter, in hex.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}{:012x}{n:06x}", nanos as u64 & 0xffff_ffff_ffff)
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_with_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn content_parts_join_text_and_refuse_other_types() {
        let parts: MessageContent = serde_json::from_value(json!([
            { "type": "text", "text": "a" },
            { "type": "input_text", "text": "b" }
        ]))
        .unwrap();
        assert_eq!(content_text(Some(parts)).unwrap(), "a\nb");
        let image: MessageContent =
            serde_json::from_value(json!([{ "type": "image_url", "image_url": { "url": "x" } }]))
                .unwrap();
        assert_eq!(content_text(Some(image)).unwrap_err().code, codes::INVALID_REQUEST);
        assert_eq!(content_text(None).unwrap(), "");
    }

    fn snapshot(multi_turn: bool, thinking: bool) -> ModelSnapshot {
        let config = hangar_config::Config::from_value(&json!({
            "models": { "m": { "backend": "stub", "stub": { "thinking": thinking } } }
        }))
        .unwrap();
        let backends = hangar_runtime::Backends::new()
            .with(Arc::new(hangar_backend::stub::StubBackend::new()));
        let manager = hangar_runtime::Manager::new(&config, backends);
        let mut snapshot = manager.model("m").unwrap();
        snapshot.capabilities.multi_turn = multi_turn;
        snapshot
    }

    #[test]
    fn single_turn_models_refuse_more_than_one_user_message() {
        let single = snapshot(false, false);
        assert!(check_capabilities(&single, ThinkingMode::Default, 1).is_ok());
        let err = check_capabilities(&single, ThinkingMode::Default, 2).unwrap_err();
        assert_eq!((err.status, err.code), (StatusCode::BAD_REQUEST, codes::INVALID_REQUEST));
        assert!(check_capabilities(&snapshot(true, false), ThinkingMode::Default, 3).is_ok());
    }

    #[test]
    fn thinking_must_be_advertised() {
        let plain = snapshot(true, false);
        assert!(check_capabilities(&plain, ThinkingMode::Default, 1).is_ok());
        for mode in [ThinkingMode::Enabled, ThinkingMode::Disabled] {
            let err = check_capabilities(&plain, mode, 1).unwrap_err();
            assert_eq!(
                (err.status, err.code),
                (StatusCode::BAD_REQUEST, codes::THINKING_UNSUPPORTED)
            );
        }
        assert!(check_capabilities(&snapshot(true, true), ThinkingMode::Enabled, 1).is_ok());
    }

    #[test]
    fn sampling_checks_ranges() {
        assert!(sampling((Some(0), "max_tokens"), None, None, None, None, None).is_err());
        assert!(sampling((None, "max_tokens"), Some(2.5), None, None, None, None).is_err());
        assert!(sampling((None, "max_tokens"), None, Some(1.5), None, None, None).is_err());
        let p = sampling(
            (Some(4), "max_tokens"),
            Some(0.5),
            Some(0.9),
            Some(40),
            Some(7),
            Some(StopSequences::One("x".into())),
        )
        .unwrap();
        assert_eq!(
            (p.max_tokens, p.top_k, p.seed, p.stop),
            (Some(4), Some(40), Some(7), vec!["x".to_owned()])
        );
    }
}
