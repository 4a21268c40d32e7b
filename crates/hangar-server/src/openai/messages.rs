//! Message shapes shared by chat completions and the Responses API: roles, content (a
//! string or text parts), and chat messages with a tool-use history.

use hangar_runtime::engine::{ChatMessage, Role};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::tools::ToolCallIn;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

/// A message's content: a string, or a list of text parts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only text parts are supported.
    Parts(Vec<ContentPart>),
}

/// One content part of a message. Parts of other types (images, audio, files) are refused
/// with 400 `invalid_request`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentPart {
    /// Text (chat completions).
    Text {
        /// The text.
        text: String,
    },
    /// Input text (Responses API).
    InputText {
        /// The text.
        text: String,
    },
    /// Earlier output text (Responses API).
    OutputText {
        /// The text.
        text: String,
    },
    /// Any other part type: refused.
    #[serde(other)]
    #[schemars(skip)]
    Unsupported,
}

/// One chat message.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatMessageIn {
    /// Who wrote it: `system`, `developer`, `user`, `assistant` or `tool`.
    pub(crate) role: MessageRole,
    /// What was said: a string or a list of text parts. `null` is read as empty.
    #[serde(default)]
    pub(crate) content: Option<MessageContent>,
    /// The tools an assistant message called (a tool-use history); answer each with a
    /// `tool` message.
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<ToolCallIn>>,
}

impl ChatMessageIn {
    /// The backend's message.
    ///
    /// # Errors
    /// 400 for unsupported content parts or tool calls.
    pub(crate) fn into_message(self) -> Result<ChatMessage, ApiError> {
        let mut message = ChatMessage::new(self.role.into(), content_text(self.content)?);
        for call in self.tool_calls.unwrap_or_default() {
            message.tool_calls.push(call.into_call()?);
        }
        Ok(message)
    }
}

/// The text of a message's content: a string, or its text parts joined by newlines.
///
/// # Errors
/// 400 `invalid_request` for parts that are not text.
pub(crate) fn content_text(content: Option<MessageContent>) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(MessageContent::Text(text)) => Ok(text),
        Some(MessageContent::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    ContentPart::Text { text }
                    | ContentPart::InputText { text }
                    | ContentPart::OutputText { text } => texts.push(text),
                    ContentPart::Unsupported => {
                        return Err(ApiError::bad_request(
                            "content parts of this type are not supported; only text parts \
                             (`text`, `input_text`, `output_text`) are",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RuntimeCode;
    use serde_json::json;

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
        assert_eq!(content_text(Some(image)).unwrap_err().code, RuntimeCode::InvalidRequest);
        assert_eq!(content_text(None).unwrap(), "");
    }
}
