//! Constrained decoding on the random-weight tiny GGUF: whatever the weights, the output has
//! the requested shape. Sampling at temperature 1 over many seeds walks many different paths
//! through each grammar; every one must end in valid output.

use std::sync::Arc;

use hangar_backend::{
    Backend, ChatMessage, FinishReason, GenerateEvent, GenerateRequest, GenerateSummary,
    OutputFormat, Prompt, Role, Runtime, RuntimeError, SamplingParams, ToolCall, ToolChoice,
    ToolDefinition, ToolUse,
};
use hangar_backend_llamacpp::LlamaCppBackend;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support;

const SEEDS: u64 = 12;

async fn load() -> Arc<dyn Runtime> {
    let request = support::load_request(support::tiny(json!({ "gguf_n_ctx": 1024 })), 0, 1);
    LlamaCppBackend::new(support::llama()).load(request).await.expect("fixture loads")
}

fn chat(seed: u64) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams {
            max_tokens: Some(400),
            temperature: Some(1.0),
            seed: Some(seed),
            ..Default::default()
        },
        ..GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new(
            Role::User,
            "What is the weather in Paris?",
        )]))
    }
}

/// Runs a generation; returns its summary, the text and the tool calls.
async fn run(
    runtime: &dyn Runtime,
    request: GenerateRequest,
) -> (Result<GenerateSummary, RuntimeError>, String, Vec<ToolCall>) {
    let (tx, mut rx) = mpsc::channel(1024);
    let result = runtime.generate(request, tx).await;
    let (mut text, mut calls) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            GenerateEvent::Text(piece) => text.push_str(&piece),
            GenerateEvent::ToolCall(call) => calls.push(call),
        }
    }
    (result, text, calls)
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).expect("test schema compiles")
}

#[tokio::test(flavor = "multi_thread")]
async fn json_schema_output_always_satisfies_the_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 12 },
            "unit": { "enum": ["celsius", "fahrenheit"] },
            "temperature": { "type": "integer", "minimum": -50, "maximum": 60 },
            "sunny": { "type": "boolean" }
        },
        "required": ["city", "unit", "temperature", "sunny"],
        "additionalProperties": false
    });
    let valid = validator(&schema);
    let runtime = load().await;
    for seed in 0..SEEDS {
        let request = GenerateRequest {
            format: Some(OutputFormat::JsonSchema(schema.clone())),
            ..chat(seed)
        };
        let (summary, text, calls) = run(&*runtime, request).await;
        let summary = summary.expect("generates");
        assert_eq!(summary.finish_reason, FinishReason::Stop, "seed {seed}: {text:?}");
        assert!(calls.is_empty());
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
        assert!(valid.is_valid(&value), "seed {seed}: {value} does not satisfy the schema");
    }
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn json_object_output_is_an_object_or_cut_by_max_tokens() {
    let runtime = load().await;
    let mut complete = 0;
    for seed in 0..SEEDS {
        let request = GenerateRequest { format: Some(OutputFormat::JsonObject), ..chat(seed) };
        let (summary, text, _) = run(&*runtime, request).await;
        match summary.expect("generates").finish_reason {
            FinishReason::Stop => {
                let value: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
                assert!(value.is_object(), "seed {seed}: {value}");
                complete += 1;
            }
            // An unconstrained object may nest deeper than max_tokens allows; what was
            // written must still be a JSON object's beginning.
            reason => {
                assert_eq!(reason, FinishReason::Length);
                assert!(text.trim_start().starts_with('{'), "seed {seed}: {text:?}");
            }
        }
    }
    assert!(complete > 0, "no seed produced a complete object");
    runtime.unload().await;
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "get_weather".to_owned(),
            description: Some("Current weather in a city".to_owned()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": { "type": "string", "maxLength": 10 },
                    "unit": { "enum": ["c", "f"] }
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: "get_time".to_owned(),
            description: None,
            parameters: json!({
                "type": "object",
                "properties": { "utc_offset": { "type": "integer", "minimum": -12, "maximum": 14 } },
                "required": ["utc_offset"],
                "additionalProperties": false
            }),
        },
    ]
}

/// Asserts `call` names one of `tools` and its arguments satisfy that tool's schema.
fn assert_valid_call(call: &ToolCall, tools: &[ToolDefinition], seed: u64) {
    let tool = tools
        .iter()
        .find(|t| t.name == call.name)
        .unwrap_or_else(|| panic!("seed {seed}: unknown function {:?}", call.name));
    let arguments: Value = serde_json::from_str(&call.arguments)
        .unwrap_or_else(|e| panic!("seed {seed}: arguments are not JSON ({e})"));
    assert!(
        validator(&tool.parameters).is_valid(&arguments),
        "seed {seed}: {arguments} does not satisfy {}'s parameters",
        tool.name
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn required_and_named_tool_choice_always_yield_a_valid_call() {
    let runtime = load().await;
    let tools = tools();
    let mut names = std::collections::BTreeSet::new();
    for seed in 0..SEEDS {
        let tool_use = ToolUse { tools: tools.clone(), choice: ToolChoice::Required };
        let request = GenerateRequest { tools: Some(tool_use), ..chat(seed) };
        let (summary, text, calls) = run(&*runtime, request).await;
        let summary = summary.expect("generates");
        assert_eq!(summary.finish_reason, FinishReason::ToolCalls, "seed {seed}: {text:?}");
        assert_eq!(text, "", "seed {seed}: a forced call has no text");
        assert_eq!(calls.len(), 1, "seed {seed}");
        assert_valid_call(&calls[0], &tools, seed);
        names.insert(calls[0].name.clone());

        let named =
            ToolUse { tools: tools.clone(), choice: ToolChoice::Function("get_time".into()) };
        let request = GenerateRequest { tools: Some(named), ..chat(seed) };
        let (summary, _, calls) = run(&*runtime, request).await;
        assert_eq!(summary.expect("generates").finish_reason, FinishReason::ToolCalls);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_time", "seed {seed}: the named function is called");
        assert_valid_call(&calls[0], &tools, seed);
    }
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_tool_choice_yields_text_or_a_valid_call() {
    let runtime = load().await;
    let tools = tools();
    for seed in 0..SEEDS {
        let tool_use = ToolUse { tools: tools.clone(), choice: ToolChoice::Auto };
        let request = GenerateRequest { tools: Some(tool_use), ..chat(seed) };
        let (summary, text, calls) = run(&*runtime, request).await;
        match summary.expect("generates").finish_reason {
            FinishReason::ToolCalls => {
                assert_eq!(calls.len(), 1);
                assert_valid_call(&calls[0], &tools, seed);
            }
            _ => {
                assert!(calls.is_empty());
                // Text never leaks a complete call: a started call is either parsed or was
                // cut short by max_tokens.
                assert!(!text.contains("</tool_call>"), "seed {seed}: {text:?}");
            }
        }
    }
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_llama_cpp_cannot_convert_is_an_invalid_request() {
    let runtime = load().await;
    let schema = json!({ "$ref": "#/$defs/missing" });
    let request = GenerateRequest { format: Some(OutputFormat::JsonSchema(schema)), ..chat(0) };
    let (summary, _, _) = run(&*runtime, request).await;
    assert!(matches!(summary, Err(RuntimeError::InvalidRequest { .. })), "{summary:?}");
    // The replica still serves.
    let (summary, _, _) = run(&*runtime, chat(1)).await;
    assert!(summary.is_ok());
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sampled_text_never_needs_replacement_characters() {
    // Random weights pick byte-fallback tokens freely; without the UTF-8 guard some seeds
    // spell invalid sequences that come out as U+FFFD.
    let runtime = load().await;
    for seed in 0..SEEDS {
        let (summary, text, _) = run(&*runtime, chat(seed)).await;
        summary.expect("generates");
        assert!(!text.contains('\u{FFFD}'), "seed {seed}: {text:?}");
    }
    runtime.unload().await;
}
