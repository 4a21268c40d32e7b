//! Tool calling and structured outputs in the OpenAI request shapes: `tools`, `tool_choice`
//! and `response_format` of chat completions, and `tools`, `tool_choice` and `text.format`
//! of the Responses API. Parsing is serde's (422 on a wrong shape); this module checks what
//! serde cannot (400 `invalid_request`) and turns the request into the backend's
//! [`ToolUse`] and [`OutputFormat`], which engines enforce by constrained decoding.

use std::collections::HashSet;

use hangar_runtime::engine::{OutputFormat, ToolCall, ToolChoice, ToolDefinition, ToolUse};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::openai::constant;

constant!(
    /// The only tool type: `function`.
    FunctionType = "function"
);

/// `tool_choice` as a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToolChoiceMode {
    /// No tool calls.
    None,
    /// Text or a call, as the model decides (the default with tools).
    Auto,
    /// Always a call.
    Required,
}

/// A function definition (chat completions: `tools[].function`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FunctionDef {
    /// The function's name: 1 to 64 of `a-z A-Z 0-9 _ -`.
    #[schemars(regex(pattern = r"^[a-zA-Z0-9_-]{1,64}$"))]
    name: String,
    /// What the function does, for the model.
    #[serde(default)]
    description: Option<String>,
    /// JSON Schema of the arguments (an object schema); no arguments when absent.
    #[serde(default)]
    #[schemars(with = "Option<Map<String, Value>>")]
    parameters: Option<Value>,
    /// Accepted; arguments always follow `parameters` (constrained decoding).
    #[serde(default)]
    strict: Option<bool>,
}

/// A tool of a chat completion request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChatTool {
    /// Must be `function`.
    #[serde(rename = "type")]
    #[schemars(with = "FunctionType")]
    kind: String,
    /// The function.
    function: FunctionDef,
}

/// A tool of a Responses API request (the function's fields are flat). Responses repeat
/// the request's tools as they came.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponsesTool {
    /// Must be `function`.
    #[serde(rename = "type")]
    #[schemars(with = "FunctionType")]
    kind: String,
    /// The function.
    #[serde(flatten)]
    function: FunctionDef,
}

/// The function a `tool_choice` object names.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct NamedFunction {
    /// The function's name.
    name: String,
}

/// `tool_choice`: `none`, `auto` (the default with tools), `required`, or one function.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ToolChoiceIn {
    /// `none`, `auto` or `required`.
    Mode(#[schemars(with = "ToolChoiceMode")] String),
    /// Chat completions: `{"type": "function", "function": {"name": …}}`.
    Chat {
        /// Must be `function`.
        #[serde(rename = "type")]
        #[schemars(with = "FunctionType")]
        kind: String,
        /// The function to call.
        function: NamedFunction,
    },
    /// Responses API: `{"type": "function", "name": …}`.
    Flat {
        /// Must be `function`.
        #[serde(rename = "type")]
        #[schemars(with = "FunctionType")]
        kind: String,
        /// The function to call.
        name: String,
    },
}

impl ToolChoiceIn {
    /// The choice as a Responses API response repeats it (the flat form).
    pub(crate) fn echo(&self) -> Self {
        match self {
            Self::Chat { kind, function } => {
                Self::Flat { kind: kind.clone(), name: function.name.clone() }
            }
            other => other.clone(),
        }
    }
}

/// A JSON Schema output format (chat completions: `response_format.json_schema`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct JsonSchemaFormat {
    /// The format's name.
    #[serde(default)]
    name: Option<String>,
    /// What the output is, for the model.
    #[serde(default)]
    description: Option<String>,
    /// The JSON Schema the output must satisfy.
    #[schemars(required, with = "Map<String, Value>")]
    schema: Option<Value>,
    /// Accepted; the output always follows the schema (constrained decoding).
    #[serde(default)]
    strict: Option<bool>,
}

/// `response_format` of a chat completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON satisfying a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `text.format` of a Responses API request (the schema's fields are flat).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum TextFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON satisfying a schema.
    JsonSchema(JsonSchemaFormat),
}

/// `text` of a Responses API request (and of its response, which repeats it).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ResponsesText {
    /// The output format.
    #[serde(default)]
    pub(crate) format: Option<TextFormat>,
}

impl ResponsesText {
    /// Free text.
    pub(crate) fn text() -> Self {
        Self { format: Some(TextFormat::Text) }
    }
}

/// A tool call in an assistant message of the history (chat completions).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ToolCallIn {
    /// The call's id.
    #[serde(default)]
    id: Option<String>,
    /// Must be `function` when present.
    #[serde(rename = "type", default)]
    #[schemars(with = "Option<FunctionType>")]
    kind: Option<String>,
    /// The called function.
    function: FunctionCallIn,
}

/// The function of a history tool call.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FunctionCallIn {
    /// The function's name.
    name: String,
    /// Its arguments, as a JSON string.
    arguments: String,
}

impl ToolCallIn {
    /// The backend's view of the call.
    pub(crate) fn into_call(self) -> Result<ToolCall, ApiError> {
        if let Some(kind) = self.kind.filter(|k| k != "function") {
            return Err(ApiError::bad_request(format!(
                "tool calls of type `{kind}` are not supported; use `function`"
            )));
        }
        Ok(ToolCall { name: self.function.name, arguments: self.function.arguments })
    }
}

impl FunctionDef {
    /// A function definition from its parts (the Messages API's tools).
    pub(crate) fn new(
        name: String,
        description: Option<String>,
        parameters: Option<Value>,
    ) -> Self {
        Self { name, description, parameters, strict: None }
    }
}

fn check_function(f: FunctionDef, at: &str) -> Result<ToolDefinition, ApiError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if f.name.is_empty() || f.name.len() > 64 || !f.name.chars().all(valid) {
        return Err(ApiError::bad_request(format!(
            "{at}: function name {:?} must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
            f.name
        )));
    }
    let parameters = match f.parameters {
        None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
        Some(p @ Value::Object(_)) => p,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "{at}: `parameters` must be a JSON Schema object, got {}",
                hangar_config::json_kind(&other)
            )));
        }
    };
    Ok(ToolDefinition { name: f.name, description: f.description, parameters })
}

/// Checks `tools` and `tool_choice` (`field` is where the tools are, for messages).
/// `None` when there are no tools or the choice is `none`.
pub(crate) fn tool_use(
    tools: Vec<(String, FunctionDef)>,
    choice: Option<ToolChoiceIn>,
    field: &str,
) -> Result<Option<ToolUse>, ApiError> {
    let mut definitions = Vec::with_capacity(tools.len());
    let mut names = HashSet::new();
    for (i, (kind, function)) in tools.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        if kind != "function" {
            return Err(ApiError::bad_request(format!(
                "{at}: tools of type `{kind}` are not supported; use `function`"
            )));
        }
        let definition = check_function(function, &at)?;
        if !names.insert(definition.name.clone()) {
            return Err(ApiError::bad_request(format!(
                "{at}: function `{}` is defined twice",
                definition.name
            )));
        }
        definitions.push(definition);
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(ToolChoiceIn::Mode(mode)) => match mode.as_str() {
            "none" => return Ok(None),
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad_request(format!(
                    "`tool_choice` must be `none`, `auto`, `required` or a function, got `{other}`"
                )));
            }
        },
        Some(ToolChoiceIn::Chat { kind, function: NamedFunction { name } })
        | Some(ToolChoiceIn::Flat { kind, name }) => {
            if kind != "function" {
                return Err(ApiError::bad_request(format!(
                    "`tool_choice` of type `{kind}` is not supported; use `function`"
                )));
            }
            if !names.contains(&name) {
                return Err(ApiError::bad_request(format!(
                    "`tool_choice` names function `{name}`, which is not in `{field}`"
                )));
            }
            ToolChoice::Function(name)
        }
    };
    if definitions.is_empty() {
        return match choice {
            ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::bad_request(format!(
                "`tool_choice` asks for a tool call but `{field}` is empty"
            ))),
        };
    }
    Ok(Some(ToolUse { tools: definitions, choice }))
}

/// A JSON Schema output format from the `schema` of `field`, checked.
///
/// # Errors
/// 400 `invalid_request` without a schema, or for one that is not an object (or `true`).
pub(crate) fn json_schema_format(
    schema: Option<Value>,
    field: &str,
) -> Result<OutputFormat, ApiError> {
    match schema {
        Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
            Ok(OutputFormat::JsonSchema(schema))
        }
        Some(other) => Err(ApiError::bad_request(format!(
            "`{field}.schema` must be a JSON Schema object, got {}",
            hangar_config::json_kind(&other)
        ))),
        None => Err(ApiError::bad_request(format!("`{field}.schema` is required"))),
    }
}

/// What a request asks of its output, checked: tools (unless `tool_choice` is `none`) and
/// a structured format. Both together are refused: constrained decoding enforces one grammar.
pub(crate) fn combine(
    tools: Option<ToolUse>,
    format: Option<OutputFormat>,
    format_field: &str,
) -> Result<(Option<ToolUse>, Option<OutputFormat>), ApiError> {
    if tools.is_some() && format.is_some() {
        return Err(ApiError::bad_request(format!(
            "`{format_field}` JSON output cannot be combined with `tools`; set `tool_choice` to \
             `none` or drop one of them"
        )));
    }
    Ok((tools, format))
}

/// Chat completions: `tools`, `tool_choice` and `response_format`, checked.
pub(crate) fn chat_output(
    tools: Option<Vec<ChatTool>>,
    choice: Option<ToolChoiceIn>,
    response_format: Option<ResponseFormat>,
) -> Result<(Option<ToolUse>, Option<OutputFormat>), ApiError> {
    let tools = tools.unwrap_or_default().into_iter().map(|t| (t.kind, t.function)).collect();
    let tools = tool_use(tools, choice, "tools")?;
    let format = match response_format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(OutputFormat::JsonObject),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            Some(json_schema_format(json_schema.schema, "response_format.json_schema")?)
        }
    };
    combine(tools, format, "response_format")
}

/// Responses API: `tools`, `tool_choice` and `text.format`, checked.
pub(crate) fn responses_output(
    tools: Option<Vec<ResponsesTool>>,
    choice: Option<ToolChoiceIn>,
    text: Option<ResponsesText>,
) -> Result<(Option<ToolUse>, Option<OutputFormat>), ApiError> {
    let tools = tools.unwrap_or_default().into_iter().map(|t| (t.kind, t.function)).collect();
    let tools = tool_use(tools, choice, "tools")?;
    let format = match text.and_then(|t| t.format) {
        None | Some(TextFormat::Text) => None,
        Some(TextFormat::JsonObject) => Some(OutputFormat::JsonObject),
        Some(TextFormat::JsonSchema(format)) => {
            Some(json_schema_format(format.schema, "text.format")?)
        }
    };
    combine(tools, format, "text.format")
}

/// The function of a tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FunctionCallOut {
    /// The called function.
    pub(crate) name: String,
    /// Its arguments: a JSON object, serialized.
    pub(crate) arguments: String,
}

/// A chat completion's `tool_calls` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ToolCallOut {
    /// The call's position among the calls (stream deltas only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<u32>,
    /// The call's id, for the `tool` message that answers it.
    pub(crate) id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub(crate) kind: FunctionType,
    /// The call.
    pub(crate) function: FunctionCallOut,
}

impl ToolCallOut {
    /// The entry of `call` with a fresh id.
    pub(crate) fn new(call: &ToolCall, index: Option<u32>) -> Self {
        Self {
            index,
            id: crate::openai::new_id("call_"),
            kind: FunctionType::Value,
            function: FunctionCallOut {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<(Option<ToolUse>, Option<OutputFormat>), ApiError> {
        #[derive(Deserialize)]
        struct Body {
            tools: Option<Vec<ChatTool>>,
            tool_choice: Option<ToolChoiceIn>,
            response_format: Option<ResponseFormat>,
        }
        let body: Body = serde_json::from_value(body).expect("shape");
        chat_output(body.tools, body.tool_choice, body.response_format)
    }

    fn weather() -> Value {
        json!([{ "type": "function", "function": {
            "name": "get_weather",
            "parameters": { "type": "object", "properties": { "city": { "type": "string" } } }
        } }])
    }

    #[test]
    fn tool_choice_modes_map_to_the_backend() {
        let (tools, format) = chat(json!({ "tools": weather() })).unwrap();
        assert_eq!(tools.unwrap().choice, ToolChoice::Auto);
        assert!(format.is_none());
        let (tools, _) = chat(json!({ "tools": weather(), "tool_choice": "required" })).unwrap();
        assert_eq!(tools.unwrap().choice, ToolChoice::Required);
        let named = json!({ "type": "function", "function": { "name": "get_weather" } });
        let (tools, _) = chat(json!({ "tools": weather(), "tool_choice": named })).unwrap();
        assert_eq!(tools.unwrap().choice, ToolChoice::Function("get_weather".into()));
        let (tools, _) = chat(json!({ "tools": weather(), "tool_choice": "none" })).unwrap();
        assert!(tools.is_none());
    }

    #[test]
    fn bad_tool_requests_are_refused_with_the_reason() {
        let cases = [
            (json!({ "tools": weather(), "tool_choice": "sometimes" }), "`tool_choice` must be"),
            (
                json!({ "tools": weather(), "tool_choice": { "type": "function", "function": { "name": "nope" } } }),
                "`nope`, which is not in `tools`",
            ),
            (json!({ "tool_choice": "required" }), "`tools` is empty"),
            (
                json!({ "tools": [{ "type": "function", "function": { "name": "bad name" } }] }),
                "tools[0]: function name",
            ),
            (
                json!({ "tools": [{ "type": "code_interpreter", "function": { "name": "x" } }] }),
                "tools of type `code_interpreter`",
            ),
            (
                json!({ "tools": [{ "type": "function", "function": { "name": "x", "parameters": [] } }] }),
                "`parameters` must be a JSON Schema object",
            ),
            (
                json!({ "tools": [
                    { "type": "function", "function": { "name": "x" } },
                    { "type": "function", "function": { "name": "x" } }
                ] }),
                "defined twice",
            ),
            (
                json!({ "tools": weather(), "response_format": { "type": "json_object" } }),
                "cannot be combined",
            ),
            (
                json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "x" } } }),
                "`response_format.json_schema.schema` is required",
            ),
        ];
        for (body, expected) in cases {
            let e = chat(body.clone()).expect_err(&body.to_string());
            assert!(e.message.contains(expected), "{body}: {}", e.message);
            assert_eq!(e.code, crate::error::RuntimeCode::InvalidRequest);
        }
    }

    #[test]
    fn response_formats_map_to_output_formats() {
        let (_, f) = chat(json!({ "response_format": { "type": "text" } })).unwrap();
        assert_eq!(f, None);
        let (_, f) = chat(json!({ "response_format": { "type": "json_object" } })).unwrap();
        assert_eq!(f, Some(OutputFormat::JsonObject));
        let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } } });
        let rf = json!({ "type": "json_schema", "json_schema": { "name": "n", "schema": schema, "strict": true } });
        let (_, f) = chat(json!({ "response_format": rf })).unwrap();
        assert_eq!(f, Some(OutputFormat::JsonSchema(schema)));
        // Tools with tool_choice none do not conflict with a format.
        let (t, f) = chat(json!({ "tools": weather(), "tool_choice": "none", "response_format": { "type": "json_object" } })).unwrap();
        assert!(t.is_none() && f.is_some());
    }
}
