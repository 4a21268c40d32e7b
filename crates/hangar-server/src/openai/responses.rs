//! `POST /v1/responses` (OpenAI Responses API): the request, its input items, and the
//! `response` object. Its event stream is in `responses_stream.rs`.

use hangar_runtime::Work;
use hangar_runtime::engine::{
    ChatMessage, FinishReason, GenerateRequest, GenerateSummary, Prompt, Role, ToolCall,
    Translation,
};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::chat::AssistantRole;
use super::messages::{MessageContent, MessageRole, content_text};
use super::responses_stream::ResponsesStream;
use super::sampling::checked;
use super::stream::{Generated, generate_all, stream_generation};
use super::{Recorder, Reply, constant, new_id, unix_now};
use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::Endpoint;
use crate::router::Ctx;
use crate::tools::{self, ResponsesText, ResponsesTool, ToolChoiceIn};

/// A message input item.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct InputMessage {
    /// Who wrote it: `system`, `developer`, `user` or `assistant`.
    role: MessageRole,
    /// A string or a list of `input_text` / `output_text` parts.
    #[serde(default)]
    content: Option<MessageContent>,
}

/// An input item with its `type`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum TypedItem {
    /// A message.
    Message(InputMessage),
    /// A function call the model made earlier.
    FunctionCall {
        /// The called function.
        name: String,
        /// Its arguments, a JSON string.
        arguments: String,
        /// The call's id.
        #[serde(default)]
        call_id: Option<String>,
    },
    /// The result of a function call.
    FunctionCallOutput {
        /// The call's id.
        #[serde(default)]
        call_id: Option<String>,
        /// The function's result.
        output: String,
    },
    /// Other item types: refused with 400.
    #[serde(other)]
    #[schemars(skip)]
    Unsupported,
}

/// One input item: a typed item, or a message without `type`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum InputItem {
    /// `message`, `function_call` or `function_call_output`.
    Typed(TypedItem),
    /// A message (the default type).
    Message(InputMessage),
}

/// The input of a response.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Input items.
    Items(#[schemars(length(min = 1))] Vec<InputItem>),
}

impl<'de> Deserialize<'de> for ResponsesInput {
    /// A string, or items each read by its `type` (`message` when absent), so a bad item's
    /// error names its index and field rather than "no variant matched".
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, mut item)| {
                    if let Value::Object(fields) = &mut item {
                        fields.entry("type").or_insert_with(|| "message".into());
                    }
                    serde_json::from_value(item)
                        .map(InputItem::Typed)
                        .map_err(|e| D::Error::custom(format!("input[{i}]: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Self::Items),
            other => Err(D::Error::custom(format!(
                "`input` must be a string or an array of items, got {}",
                hangar_config::json_kind(&other)
            ))),
        }
    }
}

/// Body of `POST /v1/responses` (OpenAI Responses API). Fields not listed here are
/// accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponsesRequest {
    /// The configured model's name.
    #[schemars(required, length(min = 1))]
    model: Option<String>,
    /// A string (one user message) or a list of items. Models whose
    /// `capabilities.multi_turn` is false accept at most one user message.
    #[schemars(required)]
    input: Option<ResponsesInput>,
    /// A system prompt placed before the input.
    instructions: Option<String>,
    /// Most tokens to generate; without it, the model's `default_max_tokens`, else until
    /// the model stops or its context is full.
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
    thinking: Option<crate::wire::ThinkingMode>,
    /// TranslateGemma: the source language code; omit it, or use `auto` / `mixed`, for
    /// mixed-source input. Needs `target_lang_code`.
    #[schemars(regex(pattern = r"\S"))]
    source_lang_code: Option<String>,
    /// TranslateGemma: the target language code.
    #[schemars(regex(pattern = r"\S"))]
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

constant!(
    /// `response`.
    ResponseObjectType = "response"
);
constant!(
    /// `output_text`.
    OutputTextType = "output_text"
);

/// Where a response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ResponseStatus {
    /// Generating.
    InProgress,
    /// Done.
    Completed,
    /// Cut short by `max_output_tokens`.
    Incomplete,
    /// Failed; see `error`.
    Failed,
}

/// Why a response is incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IncompleteReason {
    /// `max_output_tokens` was reached.
    MaxOutputTokens,
}

/// `incomplete_details` of a response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct IncompleteDetails {
    /// Why.
    reason: IncompleteReason,
}

/// `error` of a failed response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponseError {
    /// Machine-readable code.
    code: ErrorCode,
    /// Human-readable message.
    message: String,
}

/// A text part of an output message.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    kind: OutputTextType,
    /// The text.
    pub(crate) text: String,
    /// Always empty.
    annotations: Vec<Value>,
}

impl OutputText {
    pub(crate) fn new(text: &str) -> Self {
        Self { kind: OutputTextType::Value, text: text.to_owned(), annotations: Vec::new() }
    }
}

/// One output item of a response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    /// The assistant's message.
    Message {
        /// Item id (`msg_…`).
        id: String,
        /// Where the item is.
        status: ResponseStatus,
        /// Always `assistant`.
        role: AssistantRole,
        /// The text parts.
        content: Vec<OutputText>,
    },
    /// A function call.
    FunctionCall {
        /// Item id (`fc_…`).
        id: String,
        /// The call's id, for the `function_call_output` that answers it.
        call_id: String,
        /// The called function.
        name: String,
        /// Its arguments, a JSON string (empty while in progress).
        arguments: String,
        /// Where the item is.
        status: ResponseStatus,
    },
}

impl OutputItem {
    /// The `function_call` item of `call`.
    pub(crate) fn function_call(call_id: &str, call: &ToolCall, status: ResponseStatus) -> Self {
        Self::FunctionCall {
            id: format!("fc_{}", call_id.trim_start_matches("call_")),
            call_id: call_id.to_owned(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            status,
        }
    }
}

/// Cached input tokens.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub(crate) struct InputTokensDetails {
    /// Input tokens reused from an earlier request's KV cache, not decoded again.
    cached_tokens: u32,
}

/// Reasoning output tokens.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub(crate) struct OutputTokensDetails {
    /// Always 0.
    reasoning_tokens: u32,
}

/// Token usage of a response.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponseUsage {
    /// Tokens in the input.
    input_tokens: u32,
    /// Cached input tokens.
    input_tokens_details: InputTokensDetails,
    /// Tokens generated.
    output_tokens: u32,
    /// Reasoning tokens.
    output_tokens_details: OutputTokensDetails,
    /// Both.
    total_tokens: u32,
}

/// A `response` object: the non-streamed answer, and the `response` of stream events.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponseObject {
    /// Unique id (`resp_…`).
    pub(crate) id: String,
    /// Always `response`.
    object: ResponseObjectType,
    /// Unix seconds.
    created_at: u64,
    /// Where the response is.
    pub(crate) status: ResponseStatus,
    /// Why it failed.
    error: Option<ResponseError>,
    /// Why it is incomplete.
    incomplete_details: Option<IncompleteDetails>,
    /// The request's instructions.
    instructions: Option<String>,
    /// The request's `max_output_tokens`.
    max_output_tokens: Option<u32>,
    /// The model.
    model: String,
    /// The message (when there is text or no call) and the function calls.
    output: Vec<OutputItem>,
    /// All output text (non-streamed finished responses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_text: Option<String>,
    /// Always false: at most one call per generation.
    parallel_tool_calls: bool,
    /// The request's temperature.
    temperature: Option<f64>,
    /// The request's output format.
    text: ResponsesText,
    /// The request's `tool_choice`.
    tool_choice: ToolChoiceIn,
    /// The request's tools.
    tools: Vec<ResponsesTool>,
    /// The request's `top_p`.
    top_p: Option<f64>,
    /// Token usage, once finished.
    usage: Option<ResponseUsage>,
    /// Always empty.
    metadata: Map<String, Value>,
}

/// What a response object repeats from its request, and its ids.
pub(crate) struct ResponseMeta {
    pub(crate) id: String,
    pub(crate) message_id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    tools: Vec<ResponsesTool>,
    tool_choice: ToolChoiceIn,
    text: ResponsesText,
}

impl ResponseMeta {
    fn object(&self, status: ResponseStatus, output: Vec<OutputItem>) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: ResponseObjectType::Value,
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details: None,
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens,
            model: self.model.clone(),
            output,
            output_text: None,
            parallel_tool_calls: false,
            temperature: self.temperature,
            text: self.text.clone(),
            tool_choice: self.tool_choice.clone(),
            tools: self.tools.clone(),
            top_p: self.top_p,
            usage: None,
            metadata: Map::new(),
        }
    }

    /// The message item, with its text once there is some.
    pub(crate) fn message(&self, status: ResponseStatus, text: Option<&str>) -> OutputItem {
        OutputItem::Message {
            id: self.message_id.clone(),
            status,
            role: AssistantRole::Value,
            content: text.map(OutputText::new).into_iter().collect(),
        }
    }

    /// A response that was created and has not finished.
    pub(crate) fn in_progress(&self) -> ResponseObject {
        self.object(ResponseStatus::InProgress, Vec::new())
    }

    /// A response that failed with `error`.
    pub(crate) fn failed(&self, error: &ApiError) -> ResponseObject {
        let mut object = self.object(ResponseStatus::Failed, Vec::new());
        object.error = Some(ResponseError { code: error.code, message: error.message.clone() });
        object
    }

    /// A finished response: `completed`, or `incomplete` when `max_output_tokens` cut it
    /// short. Its output is the message (when `with_message`) followed by one
    /// `function_call` item per call (with its `call_id`).
    pub(crate) fn finished(
        &self,
        text: &str,
        with_message: bool,
        calls: &[(String, ToolCall)],
        summary: &GenerateSummary,
    ) -> ResponseObject {
        let status = match summary.finish_reason {
            FinishReason::Stop | FinishReason::ToolCalls => ResponseStatus::Completed,
            FinishReason::Length => ResponseStatus::Incomplete,
        };
        let mut output = Vec::with_capacity(calls.len() + 1);
        if with_message {
            output.push(self.message(status, Some(text)));
        }
        output.extend(
            calls
                .iter()
                .map(|(id, call)| OutputItem::function_call(id, call, ResponseStatus::Completed)),
        );
        let mut object = self.object(status, output);
        if status == ResponseStatus::Incomplete {
            object.incomplete_details =
                Some(IncompleteDetails { reason: IncompleteReason::MaxOutputTokens });
        }
        object.usage = Some(ResponseUsage {
            input_tokens: summary.prompt_tokens,
            input_tokens_details: InputTokensDetails { cached_tokens: summary.cached_tokens },
            output_tokens: summary.completion_tokens,
            output_tokens_details: OutputTokensDetails { reasoning_tokens: 0 },
            total_tokens: summary.prompt_tokens.saturating_add(summary.completion_tokens),
        });
        object.output_text = Some(text.to_owned());
        object
    }
}

/// `POST /v1/responses`.
pub(crate) async fn handle(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::Responses);
    let reply = response(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn response(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let route = hangar_runtime::engine::ForwardRoute::Responses;
    super::limits::check(ctx, rec, route)?;
    if let Some(reply) = super::forward::forwarded(ctx, rec, route).await {
        return reply;
    }
    let body: ResponsesRequest = parse_json(&ctx.body, false)?;
    let model = rec.model(body.model)?;
    let mut messages = Vec::new();
    if let Some(instructions) = body.instructions.clone().filter(|s| !s.is_empty()) {
        messages.push(ChatMessage::new(Role::System, instructions));
    }
    match body.input {
        Some(ResponsesInput::Text(text)) => messages.push(ChatMessage::new(Role::User, text)),
        Some(ResponsesInput::Items(items)) if items.is_empty() => {
            return Err(ApiError::bad_request("`input` must not be an empty array"));
        }
        Some(ResponsesInput::Items(items)) => {
            for (i, item) in items.into_iter().enumerate() {
                input_item(&mut messages, i, item)?;
            }
        }
        None => return Err(ApiError::bad_request("`input` is required")),
    }
    let translation = translation(body.source_lang_code, body.target_lang_code)?;
    let tools_echo = body.tools.clone().unwrap_or_default();
    let choice_echo = body
        .tool_choice
        .as_ref()
        .map_or_else(|| ToolChoiceIn::Mode("auto".into()), ToolChoiceIn::echo);
    let text_echo = body.text.clone().unwrap_or_else(ResponsesText::text);
    let (tools, format) = tools::responses_output(body.tools, body.tool_choice, body.text)?;
    let params =
        checked((body.max_output_tokens, "max_output_tokens"), body.temperature, body.top_p)?;
    let request = GenerateRequest {
        prompt: Prompt::Chat(messages),
        params,
        thinking: body.thinking.map(Into::into).unwrap_or_default(),
        translation,
        tools,
        format,
        resume: None,
    };
    let guard = ctx.state.manager.admit(&model, Work::generation(&request)).await?;
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
        let format = ResponsesStream::new(meta);
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, calls, summary } = generate_all(guard, request, rec).await?;
    let calls: Vec<(String, ToolCall)> = calls.into_iter().map(|c| (new_id("call_"), c)).collect();
    let with_message = !text.is_empty() || calls.is_empty();
    let answer = meta.finished(&text, with_message, &calls, &summary);
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}

/// The TranslateGemma language codes of a request.
fn translation(
    source: Option<String>,
    target: Option<String>,
) -> Result<Option<Translation>, ApiError> {
    for (name, code) in [("source_lang_code", &source), ("target_lang_code", &target)] {
        if code.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(ApiError::bad_request(format!("`{name}` must not be empty")));
        }
    }
    match (source, target) {
        (None, None) => Ok(None),
        (source, Some(target)) => {
            Ok(Some(Translation { source_lang_code: source, target_lang_code: target }))
        }
        (Some(_), None) => Err(ApiError::bad_request(
            "`target_lang_code` is required with `source_lang_code` (omit the source, or set it to \"auto\", for mixed-source input)",
        )),
    }
}

/// Adds one input item to the chat: a message, a `function_call` (an assistant tool call,
/// merged into the preceding assistant turn) or a `function_call_output`.
fn input_item(messages: &mut Vec<ChatMessage>, i: usize, item: InputItem) -> Result<(), ApiError> {
    match item {
        InputItem::Message(m) | InputItem::Typed(TypedItem::Message(m)) => {
            messages.push(ChatMessage::new(m.role.into(), content_text(m.content)?));
        }
        InputItem::Typed(TypedItem::FunctionCall { name, arguments, .. }) => {
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
        InputItem::Typed(TypedItem::FunctionCallOutput { output, .. }) => {
            messages.push(ChatMessage::new(Role::Tool, output));
        }
        InputItem::Typed(TypedItem::Unsupported) => {
            return Err(ApiError::bad_request(format!(
                "input[{i}]: items of this type are not supported; send `message`, \
                 `function_call` or `function_call_output` items"
            )));
        }
    }
    Ok(())
}
