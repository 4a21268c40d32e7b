//! Tool use, shared by every format: tools described in the system turn and earlier calls
//! written back, as Qwen3's template does.
//!
//! [`with_tools`] prepares a chat for tool use before any format renders it, in the
//! Hermes / Qwen3 convention (the Qwen3 official chat template's `tools` branch, which most
//! tool-tuned GGUFs without a native format understand): the function signatures go into the
//! system message inside `<tools></tools>`, with the instruction to answer
//! `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`, and earlier assistant tool calls
//! are written back in that same form. JSON is written as Python's `json.dumps` does
//! (`", "` and `": "` separators, keys in the request's order), as the template's `tojson`.

use hangar_backend::{ChatMessage, Role, ToolCall, ToolDefinition};
use serde::Serialize;

/// Opens a tool call in the model's output.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call in the model's output.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// The chat prepared for tool use in the Hermes / Qwen3 convention: `tools` (may be empty)
/// are described in the system message, one is created when there is none, and assistant
/// messages' `tool_calls` are appended to their content as `<tool_call>` blocks. Without
/// tools and tool calls the messages are returned unchanged.
pub fn with_tools(messages: &[ChatMessage], tools: &[ToolDefinition]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = messages
        .iter()
        .map(|m| {
            if m.tool_calls.is_empty() {
                return m.clone();
            }
            let mut content = m.content.clone();
            for call in &m.tool_calls {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&tool_call_text(call));
            }
            ChatMessage::new(m.role, content)
        })
        .collect();
    if tools.is_empty() {
        return out;
    }
    let mut block = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), tool.name.clone().into());
        if let Some(description) = &tool.description {
            function.insert("description".into(), description.clone().into());
        }
        function.insert("parameters".into(), tool.parameters.clone());
        let entry = serde_json::json!({ "type": "function", "function": function });
        block.push('\n');
        block.push_str(&python_json(&entry));
    }
    block.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    match out.first_mut() {
        Some(first) if first.role == Role::System => {
            first.content = format!("{}\n\n{block}", first.content);
        }
        _ => out.insert(0, ChatMessage::new(Role::System, block)),
    }
    out
}

/// One tool call as the model writes it: `<tool_call>\n{"name": "…", "arguments": …}\n</tool_call>`.
pub fn tool_call_text(call: &ToolCall) -> String {
    let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments)
        .map_or_else(|_| call.arguments.clone(), |v| python_json(&v));
    format!(
        "{TOOL_CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{TOOL_CALL_CLOSE}",
        python_json(&serde_json::Value::String(call.name.clone()))
    )
}

/// JSON as Python's `json.dumps(value, ensure_ascii=False)` writes it.
pub fn python_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    // Writing a `Value` into a Vec cannot fail.
    let _ = value.serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// `", "` between items and `": "` after keys, like Python's default separators.
pub(super) struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
