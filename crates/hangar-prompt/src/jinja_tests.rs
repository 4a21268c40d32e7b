//! The chat-template renderer on published templates: SmolLM2's (a default system prompt),
//! a Qwen 2.5-style one that reads `tools` and tool calls, and templates that refuse or loop.

use super::*;
use hangar_backend::ToolCall;

/// SmolLM2-135M-Instruct's template, as its GGUF carries it.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The tool part of Qwen 2.5's template (abridged, same constructs: `tools | tojson`,
/// `tool_call.function`, `arguments | tojson`, whitespace control and block trimming).
const QWEN_TOOLS: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

fn chat(pairs: &[(Role, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(role, text)| ChatMessage::new(*role, *text)).collect()
}

#[test]
fn smollm2_adds_its_default_system_prompt_only_when_the_chat_has_none() {
    let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
    assert!(!t.reads_tools());
    let plain = t.render(&chat(&[(Role::User, "Hi")]), &[]).unwrap();
    assert_eq!(
        plain,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let own = t.render(&chat(&[(Role::System, "Be terse."), (Role::User, "Hi")]), &[]).unwrap();
    assert_eq!(
        own,
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn a_template_that_reads_tools_gets_them_and_the_calls_as_objects_in_order() {
    let t = ChatTemplate::new(QWEN_TOOLS, "", "<|im_end|>").unwrap();
    assert!(t.reads_tools());
    let tool = ToolDefinition {
        name: "get_weather".into(),
        description: Some("Weather in a city".into()),
        parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    };
    let mut messages = chat(&[(Role::User, "  Weather in Paris?  "), (Role::Assistant, "")]);
    messages[1].tool_calls =
        vec![ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }];
    let text = t.render(&messages, &[tool]).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \
         \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": \
         \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools><|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
         {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\
         <|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn tojson_writes_pythons_json_dumps() {
    let t = ChatTemplate::new(
        "{{ {'a': [1, 'é'], 'b': none} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[], &[]).unwrap(), "{\"a\": [1, \"é\"], \"b\": null}|{\n  \"a\": 1\n}");
}

#[test]
fn raise_exception_fails_the_render_with_the_templates_message() {
    let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start \
                  with user') }}{% endif %}{{ messages[0].content }}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(t.render(&chat(&[(Role::User, "ok")]), &[]).unwrap(), "ok");
    let err = t.render(&chat(&[(Role::Assistant, "no")]), &[]).unwrap_err();
    assert!(err.to_string().contains("Conversation must start with user"), "{err}");
}

#[test]
fn a_template_that_loops_on_its_input_runs_out_of_fuel() {
    let source = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let err = t.render(&chat(&[(Role::User, "x")]), &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfFuel, "{err}");
}

#[test]
fn a_template_with_a_syntax_error_is_refused_when_compiled() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}", "", "").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::SyntaxError, "{err}");
}

#[test]
fn strftime_formats_utc_dates_like_python() {
    // 2026-11-26 15:04:05 UTC.
    let secs = 1_795_705_445;
    assert_eq!(strftime("%d %b %Y", secs), "26 Nov 2026");
    assert_eq!(strftime("%Y-%m-%d %H:%M:%S %B %%%q", secs), "2026-11-26 15:04:05 November %%q");
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(11_016), (2000, 2, 29));
}
