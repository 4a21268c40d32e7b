//! The Messages API's shapes: the request of `POST /v1/messages` (and of
//! `/v1/messages/count_tokens`), the `message` answer, and the error envelope.

use schemars::JsonSchema;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// An optional object field: serde reads a struct from an array too, which the schema
/// does not allow.
fn object<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let map: Option<Map<String, Value>> = Option::deserialize(d)?;
    map.map(|m| serde_json::from_value(Value::Object(m)).map_err(D::Error::custom)).transpose()
}

/// Drops the `default: null` that `#[serde(default)]` gives a field the schema requires as
/// non-null (a missing field is refused all the same).
fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// An optional list of objects, each read as [`object`] reads one.
fn objects<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let maps: Option<Vec<Map<String, Value>>> = Option::deserialize(d)?;
    let read = |maps: Vec<Map<String, Value>>| {
        maps.into_iter()
            .enumerate()
            .map(|(i, m)| {
                serde_json::from_value(Value::Object(m))
                    .map_err(|e| D::Error::custom(format!("[{i}]: {e}")))
            })
            .collect()
    };
    maps.map(read).transpose()
}

use crate::openai::constant;

/// Who wrote a message: the Messages API has no system or tool role (the system prompt is
/// `system`, tool results are `tool_result` blocks of a user message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// The user.
    User,
    /// The model.
    Assistant,
}

/// The formats of a base64 image.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub(crate) enum MediaType {
    /// JPEG.
    #[serde(rename = "image/jpeg")]
    Jpeg,
    /// PNG.
    #[serde(rename = "image/png")]
    Png,
    /// GIF.
    #[serde(rename = "image/gif")]
    Gif,
    /// WebP.
    #[serde(rename = "image/webp")]
    Webp,
}

impl MediaType {
    /// The MIME type.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Jpeg => "image/jpeg",
            Self::Png => "image/png",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
        }
    }
}

/// Where an image comes from.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ImageSource {
    /// The image's bytes, base64.
    Base64 {
        /// The image's format.
        media_type: MediaType,
        /// The bytes, base64.
        data: String,
    },
    /// An image on the web (only for models whose config allows remote media).
    Url {
        /// Its address.
        url: String,
    },
}

/// What a `tool_result` holds: a string or text (and image) blocks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ToolResultContent {
    /// Plain text.
    Text(String),
    /// Blocks; their text is joined by newlines.
    Blocks(Vec<ContentBlock>),
}

/// One block of a message's content.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, for models whose `capabilities.modalities` include `image`.
    Image {
        /// Where it comes from.
        source: ImageSource,
    },
    /// A tool call the model made (an assistant message of a tool-use history).
    ToolUse {
        /// The call's id, which its `tool_result` names.
        id: String,
        /// The called tool.
        name: String,
        /// Its input: a JSON object.
        #[schemars(with = "Map<String, Value>")]
        input: Value,
    },
    /// The result of a tool call (in a user message).
    ToolResult {
        /// The id of the `tool_use` it answers.
        tool_use_id: String,
        /// What the tool returned.
        #[serde(default)]
        content: Option<ToolResultContent>,
        /// Whether the tool failed.
        #[serde(default)]
        is_error: Option<bool>,
    },
    /// The model's reasoning from an earlier turn, with the signature Hangar gave it.
    /// Accepted back and left out of the prompt, as the chat templates leave out earlier
    /// turns' reasoning.
    Thinking {
        /// The reasoning.
        thinking: String,
        /// Its signature.
        #[serde(default)]
        signature: Option<String>,
    },
    /// Reasoning another server redacted: accepted back and left out.
    RedactedThinking {
        /// Opaque.
        data: String,
    },
    /// Other block types (documents, search results, server tools): refused with 400.
    #[serde(other)]
    #[schemars(skip)]
    Unsupported,
}

/// A message's content: a string or blocks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<ContentBlock>),
}

/// One message of the conversation.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct MessageIn {
    /// `user` or `assistant`.
    pub(crate) role: Role,
    /// A string or content blocks.
    pub(crate) content: Content,
}

/// A block of the system prompt: text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum SystemBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
}

/// The system prompt: a string or text blocks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum System {
    /// Plain text.
    Text(String),
    /// Text blocks, joined by newlines.
    Blocks(Vec<SystemBlock>),
}

/// A tool the model may call.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ToolIn {
    /// The tool's name: 1 to 64 of `a-z A-Z 0-9 _ -`.
    #[schemars(regex(pattern = r"^[a-zA-Z0-9_-]{1,64}$"))]
    pub(crate) name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub(crate) description: Option<String>,
    /// JSON Schema of its input (an object schema).
    #[schemars(with = "Map<String, Value>")]
    pub(crate) input_schema: Value,
    /// `custom` or absent; server tools (`web_search_…` and the like) are refused.
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
}

/// How the model may use the tools.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ToolChoice {
    /// Text or a call, as the model decides (the default with tools).
    Auto {
        /// Accepted; Hangar makes at most one call per turn.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// A call of one of the tools.
    Any {
        /// Accepted; Hangar makes at most one call per turn.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// A call of the named tool.
    Tool {
        /// The tool.
        name: String,
        /// Accepted; Hangar makes at most one call per turn.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// No call.
    None,
}

/// How thinking blocks show their reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ThinkingDisplay {
    /// The reasoning as the model wrote it (Hangar does not summarize).
    Summarized,
    /// Empty `thinking`, the signature only.
    Omitted,
}

/// Extended thinking, mapped to the same per-request switch as the other routes' `thinking`:
/// `enabled` and `between_tools` ask the model to think, `disabled` not to (both need the
/// model's `capabilities.thinking_modes` to allow it, else 400 `thinking_unsupported`);
/// `adaptive` leaves it to the model (its default).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Thinking {
    /// Think before answering.
    Enabled {
        /// Accepted and ignored: no engine here bounds its reasoning apart from
        /// `max_tokens`, which bounds reasoning and answer together.
        #[schemars(range(min = 1))]
        budget_tokens: u32,
        /// How the reasoning shows.
        #[serde(default)]
        display: Option<ThinkingDisplay>,
    },
    /// The model decides (its default behaviour).
    Adaptive {
        /// How the reasoning shows.
        #[serde(default)]
        display: Option<ThinkingDisplay>,
    },
    /// Think between tool calls: the same switch as `enabled`.
    BetweenTools,
    /// Answer without thinking.
    Disabled,
}

impl Thinking {
    /// Whether the reasoning is to be left out of the blocks (`display: omitted`).
    pub(crate) fn omitted(&self) -> bool {
        matches!(
            self,
            Self::Enabled { display: Some(ThinkingDisplay::Omitted), .. }
                | Self::Adaptive { display: Some(ThinkingDisplay::Omitted) }
        )
    }
}

/// A JSON Schema the answer's text must follow.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputFormat {
    /// JSON valid against `schema`, enforced by constrained decoding.
    JsonSchema {
        /// The schema.
        #[schemars(with = "Map<String, Value>")]
        schema: Value,
    },
}

/// `output_config` of a request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct OutputConfig {
    /// Structured output.
    #[serde(default)]
    pub(crate) format: Option<OutputFormat>,
    /// Accepted and ignored (`low` … `max`): the engines here have no effort setting.
    #[serde(default)]
    pub(crate) effort: Option<String>,
}

/// `metadata` of a request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Metadata {
    /// An opaque id of the end user; accepted and not stored.
    #[serde(default)]
    pub(crate) user_id: Option<String>,
}

/// What both routes read: the model, the conversation and what shapes its prompt. The body
/// of `POST /v1/messages/count_tokens`; fields not listed here are accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Conversation {
    /// The configured model's name (or an alias).
    #[schemars(required, length(min = 1))]
    pub(crate) model: Option<String>,
    /// The conversation: user and assistant turns.
    #[schemars(required, length(min = 1), transform = no_default)]
    #[serde(default, deserialize_with = "objects")]
    pub(crate) messages: Option<Vec<MessageIn>>,
    /// The system prompt.
    #[serde(default)]
    pub(crate) system: Option<System>,
    /// Tools the model may call.
    #[serde(default, deserialize_with = "objects")]
    pub(crate) tools: Option<Vec<ToolIn>>,
    /// How the model may use the tools.
    #[serde(default)]
    pub(crate) tool_choice: Option<ToolChoice>,
    /// Extended thinking.
    #[serde(default)]
    pub(crate) thinking: Option<Thinking>,
}

/// Body of `POST /v1/messages` (Anthropic's Messages API). Fields not listed here are
/// accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct MessagesRequest {
    /// The model and the conversation.
    #[serde(flatten)]
    pub(crate) conversation: Conversation,
    /// Most tokens to generate (required, as Anthropic requires it), reasoning included.
    #[schemars(required, range(min = 1))]
    pub(crate) max_tokens: Option<u32>,
    /// Sequences that end the answer; `stop_reason` is then `stop_sequence` and
    /// `stop_sequence` names the one met.
    #[serde(default)]
    pub(crate) stop_sequences: Option<Vec<String>>,
    /// Sampling temperature, 0 to 1 (Anthropic's range); without it, the model's sampling
    /// defaults, as on the other routes. (Anthropic's current SDKs send it only in
    /// `extra_body`.)
    #[schemars(range(min = 0, max = 1))]
    pub(crate) temperature: Option<f64>,
    /// Nucleus sampling mass, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    pub(crate) top_p: Option<f64>,
    /// Top-k sampling.
    pub(crate) top_k: Option<u32>,
    /// Request metadata.
    #[serde(default, deserialize_with = "object")]
    pub(crate) metadata: Option<Metadata>,
    /// Structured output (`format`), and `effort`, accepted and ignored.
    #[serde(default, deserialize_with = "object")]
    pub(crate) output_config: Option<OutputConfig>,
    /// Answer with server-sent Messages API events.
    #[serde(default)]
    pub(crate) stream: Option<bool>,
}

constant!(
    /// `message`.
    MessageType = "message"
);
constant!(
    /// `assistant`.
    AssistantRole = "assistant"
);
constant!(
    /// `error`.
    ErrorType = "error"
);

/// One block of the model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputBlock {
    /// Reasoning, with a signature to send back on the next turn.
    Thinking {
        /// The reasoning.
        thinking: String,
        /// Hangar's signature of it.
        signature: String,
    },
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// The call's id (`toolu_…`), for the `tool_result` that answers it.
        id: String,
        /// The called tool.
        name: String,
        /// Its input.
        #[schemars(with = "Map<String, Value>")]
        input: Value,
    },
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StopReason {
    /// The model ended its turn.
    EndTurn,
    /// `max_tokens` was reached.
    MaxTokens,
    /// One of `stop_sequences` was generated (named in `stop_sequence`).
    StopSequence,
    /// The model called a tool.
    ToolUse,
}

/// Token usage, as Anthropic counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Usage {
    /// Input tokens read (not reused from the cache).
    pub(crate) input_tokens: u32,
    /// Tokens generated, reasoning included.
    pub(crate) output_tokens: u32,
    /// Always 0: Hangar's prompt cache is written without being asked.
    pub(crate) cache_creation_input_tokens: u32,
    /// Input tokens reused from an earlier request's cache; with `input_tokens`, the
    /// prompt's length.
    pub(crate) cache_read_input_tokens: u32,
}

/// The model's answer (`type: message`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct MessageOut {
    /// Unique id (`msg_…`).
    pub(crate) id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub(crate) kind: MessageType,
    /// Always `assistant`.
    pub(crate) role: AssistantRole,
    /// The model, as the request named it.
    pub(crate) model: String,
    /// Reasoning, text and tool calls, in order.
    pub(crate) content: Vec<OutputBlock>,
    /// Why it stopped (`null` in `message_start`).
    pub(crate) stop_reason: Option<StopReason>,
    /// The stop sequence that ended it.
    pub(crate) stop_sequence: Option<String>,
    /// Token usage.
    pub(crate) usage: Usage,
}

/// The answer of `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct TokenCount {
    /// The prompt's tokens, as the model's own template and tokenizer make them: the
    /// `input_tokens` plus `cache_read_input_tokens` of the same request's usage.
    pub(crate) input_tokens: u32,
}

/// An error's type and message, with Hangar's machine-readable code.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ErrorDetail {
    /// Anthropic's error type: `invalid_request_error`, `authentication_error`,
    /// `permission_error`, `not_found_error`, `request_too_large`, `rate_limit_error`,
    /// `api_error` or `overloaded_error`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Human-readable message.
    pub(crate) message: String,
    /// Hangar's error code (the one `/openapi.json` lists for the status).
    pub(crate) code: String,
}

/// Anthropic's error envelope: `{"type": "error", "error": {"type", "message", "code"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ErrorEnvelope {
    /// Always `error`.
    #[serde(rename = "type")]
    pub(crate) kind: ErrorType,
    /// What went wrong.
    pub(crate) error: ErrorDetail,
}
