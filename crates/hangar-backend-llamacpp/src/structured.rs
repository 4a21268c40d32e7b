//! Constrained decoding: a request's `response_format` or `tools` become a llama.cpp grammar
//! (GBNF, from JSON Schema through llama.cpp's `json_schema_to_grammar`), and the text of a
//! tool call becomes a [`ToolCall`] again.
//!
//! - `json_object` / `json_schema`: the grammar applies from the first token, so the whole
//!   output is JSON valid against the schema (unless `max_tokens` or the context's end cuts
//!   it short, which the finish reason `length` says).
//! - Tools: the grammar is one `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` block
//!   whose JSON is `oneOf` the allowed functions, each with its `parameters` schema. With
//!   `tool_choice` `required` or a named function it applies from the first token, so the
//!   model always calls a tool; with `auto` it is lazy: free text until the model writes
//!   `<tool_call>`, then constrained. After the block only end-of-generation is allowed, so
//!   a generation makes at most one call.

use hangar_backend::{GenerateRequest, OutputFormat, RuntimeError, ToolCall, ToolChoice};
use serde_json::{Value, json};

use crate::prompt::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};

/// The grammar's start rule.
pub(crate) const ROOT: &str = "root";

/// How a generation is constrained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Constraint {
    /// Free text.
    Free,
    /// The whole output follows `grammar` (structured JSON output).
    Json {
        /// GBNF with start rule [`ROOT`].
        grammar: String,
    },
    /// A tool call block following `grammar`: from the first token, or (`lazy`) once the
    /// model writes [`TOOL_CALL_OPEN`].
    Tools {
        /// GBNF with start rule [`ROOT`]; it starts with [`TOOL_CALL_OPEN`].
        grammar: String,
        /// Whether free text may come first (`tool_choice: auto`).
        lazy: bool,
        /// Names of the callable functions.
        names: Vec<String>,
    },
}

fn invalid(message: impl Into<String>) -> RuntimeError {
    RuntimeError::InvalidRequest { message: message.into() }
}

/// The constraint of `request`.
///
/// # Errors
/// [`RuntimeError::InvalidRequest`] when a schema cannot be turned into a grammar (llama.cpp's
/// reason) or `tool_choice` names a function that is not in `tools`.
pub(crate) fn plan(request: &GenerateRequest) -> Result<Constraint, RuntimeError> {
    if let Some(tools) = &request.tools {
        let (lazy, allowed): (bool, Vec<_>) = match &tools.choice {
            ToolChoice::Auto => (true, tools.tools.iter().collect()),
            ToolChoice::Required => (false, tools.tools.iter().collect()),
            ToolChoice::Function(name) => {
                (false, tools.tools.iter().filter(|t| &t.name == name).collect())
            }
        };
        if allowed.is_empty() {
            return Err(invalid("tool_choice names no function of `tools`"));
        }
        let calls: Vec<Value> = allowed
            .iter()
            .map(|tool| {
                let parameters = match &tool.parameters {
                    Value::Object(o) if !o.is_empty() => tool.parameters.clone(),
                    _ => json!({ "type": "object" }),
                };
                json!({
                    "type": "object",
                    "properties": { "name": { "const": tool.name }, "arguments": parameters },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = match <[Value; 1]>::try_from(calls) {
            Ok([one]) => one,
            Err(calls) => json!({ "oneOf": calls }),
        };
        let call = rename_rule(&schema_grammar(&schema, "tools")?, ROOT, "tool-call-json");
        let grammar = format!(
            "{ROOT} ::= {} tool-call-json {}\n{call}",
            gbnf_literal(&format!("{TOOL_CALL_OPEN}\n")),
            gbnf_literal(&format!("\n{TOOL_CALL_CLOSE}")),
        );
        let names = allowed.iter().map(|t| t.name.clone()).collect();
        return Ok(Constraint::Tools { grammar, lazy, names });
    }
    match &request.format {
        None => Ok(Constraint::Free),
        Some(OutputFormat::JsonObject) => {
            Ok(Constraint::Json { grammar: schema_grammar(&json!({ "type": "object" }), "")? })
        }
        Some(OutputFormat::JsonSchema(schema)) => {
            Ok(Constraint::Json { grammar: schema_grammar(schema, "response_format")? })
        }
    }
}

/// llama.cpp's grammar for `schema`.
fn schema_grammar(schema: &Value, what: &str) -> Result<String, RuntimeError> {
    llama_cpp_2::json_schema_to_grammar(&schema.to_string()).map_err(|e| {
        invalid(format!("llama.cpp cannot turn the {what} JSON schema into a grammar: {e}"))
    })
}

/// `text` as a GBNF string literal.
fn gbnf_literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Renames rule `from` to `to` in a GBNF grammar: its definition and every reference,
/// leaving string literals and character classes alone.
pub(crate) fn rename_rule(grammar: &str, from: &str, to: &str) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut out = String::with_capacity(grammar.len());
    let mut chars = grammar.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some((_, d)) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some((_, e)) = chars.next() {
                            out.push(e);
                        }
                    } else if d == close {
                        break;
                    }
                }
            }
            c if is_name(c) => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if !is_name(d) {
                        break;
                    }
                    end = j + d.len_utf8();
                    chars.next();
                }
                let word = &grammar[i..end];
                out.push_str(if word == from { to } else { word });
            }
            c => out.push(c),
        }
    }
    out
}

/// The tool call in `text` (what the model wrote after [`TOOL_CALL_OPEN`]), when it is a
/// complete call of one of `names`. `arguments` is re-serialized compactly; a string holding
/// JSON is accepted too.
pub(crate) fn parse_call(text: &str, names: &[String]) -> Option<ToolCall> {
    let body = text.split(TOOL_CALL_CLOSE).next().unwrap_or(text).trim();
    let value: Value = serde_json::from_str(body).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    if !names.contains(&name) {
        return None;
    }
    let arguments = match value.get("arguments")? {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        v => v.clone(),
    };
    if !arguments.is_object() {
        return None;
    }
    Some(ToolCall { name, arguments: arguments.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renaming_touches_rule_names_only() {
        let g = "root ::= \"root\" [root] x-root root-x\nx ::= root space";
        assert_eq!(
            rename_rule(g, "root", "call"),
            "call ::= \"root\" [root] x-root root-x\nx ::= call space"
        );
        assert_eq!(rename_rule("a ::= \"\\\"root\" root", "root", "b"), "a ::= \"\\\"root\" b");
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(gbnf_literal("<a>\n\"\\"), "\"<a>\\n\\\"\\\\\"");
    }

    #[test]
    fn calls_parse_only_when_complete_and_known() {
        let names = vec!["get_weather".to_owned()];
        let call = parse_call(
            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &names,
        )
        .expect("complete call");
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.arguments, "{\"city\":\"Paris\"}");
        let stringly = parse_call(r#"{"name":"get_weather","arguments":"{\"a\":1}"}"#, &names);
        assert_eq!(stringly.map(|c| c.arguments), Some("{\"a\":1}".to_owned()));
        assert_eq!(parse_call("{\"name\": \"get_weather\", \"argu", &names), None);
        assert_eq!(parse_call(r#"{"name":"other","arguments":{}}"#, &names), None);
        assert_eq!(parse_call(r#"{"name":"get_weather","arguments":[1]}"#, &names), None);
    }
}
