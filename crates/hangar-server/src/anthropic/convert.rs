//! A Messages API request as the engines' typed one: the system prompt and the turns as chat
//! messages (tool results as `tool` messages, tool uses as the assistant's calls), the tools
//! and `tool_choice` through the same checks as the OpenAI routes, `thinking` as the
//! request-level switch, and the sampling fields.

use super::types::{
    Content, ContentBlock, Conversation, ImageSource, MessageIn, MessagesRequest, OutputFormat,
    Role, System, SystemBlock, Thinking, ToolChoice, ToolIn, ToolResultContent,
};
use crate::error::ApiError;
use crate::openai::sampling::checked;
use crate::tools::{self, FunctionDef, ToolChoiceIn};
use hangar_runtime::engine::{
    ChatMessage, GenerateRequest, Prompt, Role as ChatRole, SamplingParams, ThinkingMode, ToolCall,
    ToolUse,
};
use serde_json::Value;

/// An image block of a turn: engines that take OpenAI requests get it as an `image_url`
/// part of that turn's message; the typed engines take none.
pub(crate) struct Image {
    /// The index of its message in the prompt's messages.
    pub(crate) message: usize,
    /// Where the block is in the request (`messages[i].content[j]`), for errors.
    pub(crate) at: String,
    pub(crate) source: ImageSource,
}

impl Image {
    /// The image as an OpenAI `image_url` URL: a `data:` URL for base64 bytes.
    pub(crate) fn url(&self) -> String {
        match &self.source {
            ImageSource::Base64 { media_type, data } => {
                format!("data:{};base64,{data}", media_type.as_str())
            }
            ImageSource::Url { url } => url.clone(),
        }
    }

    /// Whether the engine would fetch it from the web.
    pub(crate) fn remote(&self) -> bool {
        matches!(self.source, ImageSource::Url { .. })
    }
}

/// A conversation's prompt, tools and thinking switch, checked.
pub(crate) struct Prompted {
    pub(crate) model: Option<String>,
    pub(crate) messages: Vec<ChatMessage>,
    /// Image blocks, by message; checked against the model before anything is admitted.
    pub(crate) images: Vec<Image>,
    pub(crate) tools: Option<ToolUse>,
    pub(crate) thinking: ThinkingMode,
    /// `display: omitted`: thinking blocks carry their signature only.
    pub(crate) omit_thinking: bool,
}

impl Prompted {
    /// The engines' request for this conversation: its messages, tools and thinking switch,
    /// with default sampling.
    pub(crate) fn into_request(self) -> GenerateRequest {
        let mut request = GenerateRequest::new(Prompt::Chat(self.messages));
        request.thinking = self.thinking;
        request.tools = self.tools;
        request
    }
}

/// A `POST /v1/messages` request, read.
pub(crate) struct Converted {
    pub(crate) model: Option<String>,
    pub(crate) request: GenerateRequest,
    /// The stop sequences, for the one that ended the answer.
    pub(crate) stops: Vec<String>,
    pub(crate) omit_thinking: bool,
    pub(crate) images: Vec<Image>,
}

/// Reads the conversation.
///
/// # Errors
/// 400 `invalid_request` for what the engines cannot take (images, documents, server
/// tools, a tool result from the assistant) and for tools that do not hold.
pub(crate) fn prompted(conversation: Conversation) -> Result<Prompted, ApiError> {
    let Conversation { model, messages, system, tools, tool_choice, thinking } = conversation;
    let turns = messages.ok_or_else(|| ApiError::bad_request("`messages` is required"))?;
    if turns.is_empty() {
        return Err(ApiError::bad_request("`messages` must hold at least one message"));
    }
    let mut messages = Vec::with_capacity(turns.len() + 1);
    let mut images = Vec::new();
    match system {
        Some(System::Text(text)) if !text.is_empty() => {
            messages.push(ChatMessage::new(ChatRole::System, text));
        }
        Some(System::Blocks(blocks)) => {
            let text: Vec<String> =
                blocks.into_iter().map(|SystemBlock::Text { text }| text).collect();
            messages.push(ChatMessage::new(ChatRole::System, text.join("\n")));
        }
        Some(System::Text(_)) | None => {}
    }
    for (i, turn) in turns.into_iter().enumerate() {
        add_turn(&mut messages, &mut images, i, turn)?;
    }
    let omit_thinking = thinking.as_ref().is_some_and(Thinking::omitted);
    let thinking = match thinking {
        None | Some(Thinking::Adaptive { .. }) => ThinkingMode::Default,
        Some(Thinking::Enabled { .. } | Thinking::BetweenTools) => ThinkingMode::Enabled,
        Some(Thinking::Disabled) => ThinkingMode::Disabled,
    };
    let tools = tool_use(tools, tool_choice)?;
    Ok(Prompted { model, messages, images, tools, thinking, omit_thinking })
}

/// The whole generation request of `POST /v1/messages`, and its stop sequences.
///
/// # Errors
/// As [`prompted`]; 400 without `max_tokens` or with sampling values out of range.
pub(crate) fn request(body: MessagesRequest) -> Result<Converted, ApiError> {
    let max_tokens = body.max_tokens.ok_or_else(|| {
        ApiError::bad_request("`max_tokens` is required (as in Anthropic's Messages API)")
    })?;
    if let Some(t) = body.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::bad_request(format!(
            "`temperature` must be between 0 and 1, got {t}"
        )));
    }
    let mut params: SamplingParams =
        checked((Some(max_tokens), "max_tokens"), body.temperature, body.top_p)?;
    params.top_k = body.top_k;
    let stops = body.stop_sequences.unwrap_or_default();
    params.stop.clone_from(&stops);
    let format = match body.output_config.and_then(|c| c.format) {
        None => None,
        Some(OutputFormat::JsonSchema { schema }) => {
            Some(tools::json_schema_format(Some(schema), "output_config.format")?)
        }
    };
    let mut prompted = prompted(body.conversation)?;
    let (model, omit_thinking) = (prompted.model.take(), prompted.omit_thinking);
    let images = std::mem::take(&mut prompted.images);
    let mut request = prompted.into_request();
    (request.tools, request.format) =
        tools::combine(request.tools, format, "output_config.format")?;
    request.params = params;
    Ok(Converted { model, request, stops, omit_thinking, images })
}

/// Adds one turn: a user turn's tool results become `tool` messages (in order, before its
/// text), an assistant turn's tool uses its calls, its images go to `images`; earlier
/// reasoning is left out.
fn add_turn(
    messages: &mut Vec<ChatMessage>,
    images: &mut Vec<Image>,
    i: usize,
    turn: MessageIn,
) -> Result<(), ApiError> {
    let role = match turn.role {
        Role::User => ChatRole::User,
        Role::Assistant => ChatRole::Assistant,
    };
    let blocks = match turn.content {
        Content::Text(text) => {
            messages.push(ChatMessage::new(role, text));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    let mut pictures = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match (block, role) {
            (ContentBlock::Text { text }, _) => texts.push(text),
            (ContentBlock::ToolResult { content, is_error, .. }, ChatRole::User) => {
                let mut text = result_text(content, &at)?;
                if is_error == Some(true) {
                    text = format!("Error: {text}");
                }
                messages.push(ChatMessage::new(ChatRole::Tool, text));
            }
            (ContentBlock::ToolUse { name, input, .. }, ChatRole::Assistant) => {
                if !input.is_object() {
                    return Err(ApiError::bad_request(format!("{at}: `input` must be an object")));
                }
                calls.push(ToolCall { name, arguments: input.to_string() });
            }
            (ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. }, _) => {}
            (ContentBlock::Image { source }, ChatRole::User) => {
                if let ImageSource::Base64 { data, .. } = &source
                    && (data.is_empty() || !data.bytes().all(base64_byte))
                {
                    return Err(ApiError::bad_request(format!(
                        "{at}: `source.data` must be the image's bytes in base64"
                    )));
                }
                pictures.push((at, source));
            }
            (ContentBlock::Image { .. }, _) => {
                return Err(ApiError::bad_request(format!(
                    "{at}: image blocks belong in user messages"
                )));
            }
            (ContentBlock::ToolResult { .. }, _) => {
                return Err(ApiError::bad_request(format!(
                    "{at}: `tool_result` blocks belong in user messages"
                )));
            }
            (ContentBlock::ToolUse { .. }, _) => {
                return Err(ApiError::bad_request(format!(
                    "{at}: `tool_use` blocks belong in assistant messages"
                )));
            }
            (ContentBlock::Unsupported, _) => {
                return Err(ApiError::bad_request(format!(
                    "{at}: blocks of this type are not supported; send `text`, `tool_use`, \
                     `tool_result` or `thinking` blocks"
                )));
            }
        }
    }
    if !texts.is_empty() || !calls.is_empty() || !pictures.is_empty() {
        let message = messages.len();
        images.extend(pictures.into_iter().map(|(at, source)| Image { message, at, source }));
        let mut message = ChatMessage::new(role, texts.join("\n"));
        message.tool_calls = calls;
        messages.push(message);
    }
    Ok(())
}

/// Whether `b` can appear in standard base64 (padding included).
fn base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

/// The text of a tool result: a string, or its text blocks joined by newlines.
fn result_text(content: Option<ToolResultContent>, at: &str) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(ToolResultContent::Text(text)) => Ok(text),
        Some(ToolResultContent::Blocks(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for block in blocks {
                match block {
                    ContentBlock::Text { text } => texts.push(text),
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "{at}: a tool result's content must be text here"
                        )));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

/// Refuses a body whose `type` tags are not strings where the API has them: serde reads a
/// number as the variant of that index (`{"type": 0}` as the first), which the schema does
/// not allow. Tool and format schemas are not looked into (a property may be named `type`).
///
/// # Errors
/// 422 `invalid_request_body` naming the field.
pub(crate) fn check_tags(body: &Value) -> Result<(), ApiError> {
    fn tag(value: &Value, at: &str) -> Result<(), ApiError> {
        match value.get("type") {
            Some(t) if !t.is_string() => {
                Err(ApiError::body(format!("`{at}.type` must be a string")))
            }
            _ => Ok(()),
        }
    }
    let items = |field: &str| body.get(field).and_then(Value::as_array).into_iter().flatten();
    for field in ["tool_choice", "thinking"] {
        if let Some(value) = body.get(field) {
            tag(value, field)?;
        }
    }
    if let Some(format) = body.pointer("/output_config/format") {
        tag(format, "output_config.format")?;
    }
    for (i, item) in items("system").enumerate() {
        tag(item, &format!("system[{i}]"))?;
    }
    // A tool's `type` may be left out or null (a client tool).
    for (i, item) in items("tools").enumerate().filter(|(_, t)| !t["type"].is_null()) {
        tag(item, &format!("tools[{i}]"))?;
    }
    for (i, message) in items("messages").enumerate() {
        let blocks = message.get("content").and_then(Value::as_array).into_iter().flatten();
        for (j, block) in blocks.enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            tag(block, &at)?;
            if let Some(source) = block.get("source") {
                tag(source, &format!("{at}.source"))?;
            }
            let inner = block.get("content").and_then(Value::as_array).into_iter().flatten();
            for (k, part) in inner.enumerate() {
                tag(part, &format!("{at}.content[{k}]"))?;
            }
        }
    }
    Ok(())
}

/// The tools and `tool_choice`, through the OpenAI routes' checks.
fn tool_use(
    tools: Option<Vec<ToolIn>>,
    choice: Option<ToolChoice>,
) -> Result<Option<ToolUse>, ApiError> {
    let mut functions = Vec::new();
    for (i, tool) in tools.unwrap_or_default().into_iter().enumerate() {
        if let Some(kind) = tool.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::bad_request(format!(
                "tools[{i}]: tools of type `{kind}` (server tools) are not supported; define \
                 client tools with `name` and `input_schema`"
            )));
        }
        if !tool.input_schema.is_object() {
            return Err(ApiError::bad_request(format!(
                "tools[{i}]: `input_schema` must be a JSON Schema object"
            )));
        }
        let schema = Some(tool.input_schema);
        functions
            .push(("function".to_owned(), FunctionDef::new(tool.name, tool.description, schema)));
    }
    let choice = choice.map(|c| match c {
        ToolChoice::Auto { .. } => ToolChoiceIn::Mode("auto".into()),
        ToolChoice::Any { .. } => ToolChoiceIn::Mode("required".into()),
        ToolChoice::None => ToolChoiceIn::Mode("none".into()),
        ToolChoice::Tool { name, .. } => ToolChoiceIn::Flat { kind: "function".into(), name },
    });
    tools::tool_use(functions, choice, "tools")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn conversation(body: Value) -> Result<Prompted, ApiError> {
        prompted(serde_json::from_value(body).unwrap())
    }

    #[test]
    fn a_tool_round_trip_becomes_calls_and_tool_messages() {
        let p = conversation(json!({
            "model": "m",
            "system": [{ "type": "text", "text": "be brief" }, { "type": "text", "text": "be kind" }],
            "messages": [
                { "role": "user", "content": "weather in Paris?" },
                { "role": "assistant", "content": [
                    { "type": "thinking", "thinking": "use the tool", "signature": "s" },
                    { "type": "text", "text": "Let me look." },
                    { "type": "tool_use", "id": "toolu_1", "name": "weather", "input": { "city": "Paris" } }
                ] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "toolu_1", "content": [{ "type": "text", "text": "18C" }] },
                    { "type": "text", "text": "and tomorrow?" }
                ] }
            ],
            "tools": [{ "name": "weather", "input_schema": { "type": "object" } }],
            "tool_choice": { "type": "any" }
        }))
        .ok()
        .unwrap();
        let roles: Vec<ChatRole> = p.messages.iter().map(|m| m.role).collect();
        use ChatRole::*;
        assert_eq!(roles, [System, User, Assistant, Tool, User]);
        assert_eq!(p.messages[0].content, "be brief\nbe kind");
        assert_eq!(p.messages[2].content, "Let me look.");
        assert_eq!(p.messages[2].tool_calls[0].name, "weather");
        let arguments: Value =
            serde_json::from_str(&p.messages[2].tool_calls[0].arguments).unwrap();
        assert_eq!(arguments, json!({ "city": "Paris" }));
        assert_eq!(p.messages[3].content, "18C");
        let tools = p.tools.unwrap();
        assert_eq!(tools.choice, hangar_runtime::engine::ToolChoice::Required);
    }

    #[test]
    fn images_are_kept_with_the_message_they_belong_to() {
        let png = json!({ "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" });
        let p = conversation(json!({
            "model": "m",
            "system": "look",
            "messages": [
                { "role": "user", "content": "hi" },
                { "role": "assistant", "content": "hello" },
                { "role": "user", "content": [
                    { "type": "text", "text": "what is this?" },
                    { "type": "image", "source": png },
                    { "type": "image", "source": { "type": "url", "url": "https://x/a.png" } }
                ] },
                { "role": "user", "content": [{ "type": "image", "source": png }] }
            ]
        }))
        .ok()
        .unwrap();
        let at: Vec<(usize, &str)> = p.images.iter().map(|i| (i.message, i.at.as_str())).collect();
        assert_eq!(
            at,
            [
                (3, "messages[2].content[1]"),
                (3, "messages[2].content[2]"),
                (4, "messages[3].content[0]")
            ]
        );
        assert_eq!(p.messages[3].content, "what is this?");
        assert_eq!(p.messages[4].content, "");
        assert_eq!(p.images[0].url(), "data:image/png;base64,iVBORw0KGgo=");
        assert_eq!((p.images[0].remote(), p.images[1].remote()), (false, true));
    }

    #[test]
    fn what_the_engines_cannot_take_is_refused_with_where() {
        let refused = |content: Value, role: &str| {
            let body = json!({ "model": "m", "messages": [{ "role": role, "content": content }] });
            conversation(body).err().map(|e| e.message).unwrap_or_default()
        };
        let image =
            json!([{ "type": "image", "source": { "type": "url", "url": "https://x/a.png" } }]);
        assert!(refused(image, "assistant").contains("messages[0].content[0]: image"));
        let garbled = json!([{ "type": "image",
            "source": { "type": "base64", "media_type": "image/png", "data": "a,b" } }]);
        assert!(refused(garbled, "user").contains("base64"));
        let document = json!([{ "type": "document", "source": {} }]);
        assert!(refused(document, "user").contains("not supported"));
        let result = json!([{ "type": "tool_result", "tool_use_id": "t" }]);
        assert!(refused(result, "assistant").contains("belong in user"));
        let server = json!({ "model": "m", "messages": [{ "role": "user", "content": "x" }],
            "tools": [{ "type": "web_search_20250305", "name": "web_search", "input_schema": {} }] });
        assert!(conversation(server).err().unwrap().message.contains("server tools"));
        let none = json!({ "model": "m", "messages": [] });
        assert!(conversation(none).is_err());
    }
}
