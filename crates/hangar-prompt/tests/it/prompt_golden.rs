//! Golden tests of the rendered prompts: every prompt format renders each conversation exactly
//! as the official template requires (see the crate docs of `hangar-prompt` for the sources).
//!
//! The expected texts live in `tests/golden/<case>.txt`, byte for byte (no trailing newline is
//! added). The tests never rewrite them; `HANGAR_BLESS=1 cargo test -p hangar-prompt
//! prompt_golden` does, after which each changed file must be read against the official
//! template before it is committed.

use std::path::PathBuf;

use hangar_backend::{
    ChatMessage, Prompt, Role, ThinkingMode, ToolCall, ToolDefinition, Translation,
};
use hangar_config::PromptFormat;
use hangar_prompt::{
    self as prompt, PromptError, RenderRequest, expects_bos, multi_turn, render, thinking_modes,
    with_tools,
};

struct Case {
    name: &'static str,
    format: PromptFormat,
    messages: Vec<ChatMessage>,
    thinking: ThinkingMode,
    translation: Option<Translation>,
}

fn msg(role: Role, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn single_turn() -> Vec<ChatMessage> {
    vec![msg(Role::User, "What is the capital of France?")]
}

/// System prompt plus two user turns; the earlier answer carries reasoning the formats strip.
fn system_multi_turn(previous_answer: &str) -> Vec<ChatMessage> {
    vec![
        msg(Role::System, "You are a concise geography tutor."),
        msg(Role::User, "What is the capital of France?"),
        msg(Role::Assistant, previous_answer),
        msg(Role::User, "And of Italy?"),
    ]
}

fn translation(source: Option<&str>, target: &str) -> Option<Translation> {
    Some(Translation {
        source_lang_code: source.map(str::to_owned),
        target_lang_code: target.to_owned(),
    })
}

fn case(
    name: &'static str,
    format: PromptFormat,
    messages: Vec<ChatMessage>,
    thinking: ThinkingMode,
) -> Case {
    Case { name, format, messages, thinking, translation: None }
}

fn translate_case(name: &'static str, text: &str, source: Option<&str>, target: &str) -> Case {
    Case {
        name,
        format: PromptFormat::TranslategemmaTemplate,
        messages: vec![msg(Role::User, text)],
        thinking: ThinkingMode::Default,
        translation: translation(source, target),
    }
}

fn cases() -> Vec<Case> {
    use PromptFormat::*;
    use ThinkingMode::*;
    vec![
        // generic
        case("generic_single_turn", Generic, single_turn(), Default),
        case("generic_system_multi_turn", Generic, system_multi_turn("Paris."), Default),
        case(
            "generic_tool_result",
            Generic,
            vec![
                msg(Role::User, "What's the weather in Oslo?"),
                msg(Role::Assistant, ""),
                msg(Role::Tool, "{\"temp_c\": 3}"),
            ],
            Default,
        ),
        // mistral_template (V7-Tekken)
        case("mistral_single_turn", MistralTemplate, single_turn(), Default),
        case("mistral_system_multi_turn", MistralTemplate, system_multi_turn("Paris."), Default),
        case(
            "mistral_multi_turn_no_system",
            MistralTemplate,
            system_multi_turn("Paris.").split_off(1),
            Default,
        ),
        // qwen3_template
        case("qwen3_single_turn", Qwen3Template, single_turn(), Default),
        case(
            "qwen3_system_multi_turn",
            Qwen3Template,
            system_multi_turn("<think>\nThe user asks about France.\n</think>\n\nParis."),
            Default,
        ),
        case("qwen3_thinking_enabled", Qwen3Template, single_turn(), Enabled),
        case("qwen3_thinking_disabled", Qwen3Template, single_turn(), Disabled),
        case(
            "qwen3_system_multi_turn_thinking_disabled",
            Qwen3Template,
            system_multi_turn("<think>\nThe user asks about France.\n</think>\n\nParis."),
            Disabled,
        ),
        case(
            "qwen3_tool_results",
            Qwen3Template,
            vec![
                msg(Role::User, "Weather in Oslo and Bergen?"),
                msg(Role::Assistant, ""),
                msg(Role::Tool, "{\"city\": \"Oslo\", \"temp_c\": 3}"),
                msg(Role::Tool, "{\"city\": \"Bergen\", \"temp_c\": 7}"),
            ],
            Default,
        ),
        // gemma4_template
        case("gemma4_single_turn", Gemma4Template, single_turn(), Default),
        case(
            "gemma4_system_multi_turn",
            Gemma4Template,
            system_multi_turn("<|channel>thought\nThe user asks about France.<channel|>Paris."),
            Default,
        ),
        case("gemma4_thinking_enabled", Gemma4Template, single_turn(), Enabled),
        case(
            "gemma4_system_multi_turn_thinking_enabled",
            Gemma4Template,
            system_multi_turn("Paris."),
            Enabled,
        ),
        case("gemma4_thinking_disabled", Gemma4Template, single_turn(), Disabled),
        // translategemma_template
        translate_case("translategemma_known_source", "Hello, how are you?", Some("en"), "es"),
        translate_case(
            "translategemma_region_codes",
            "Você já viu o pôr do sol na praia?",
            Some("pt_BR"),
            "zh-TW",
        ),
        translate_case(
            "translategemma_omitted_source",
            "Guten Morgen! ¿Cómo estás? Merci beaucoup.",
            None,
            "en",
        ),
        translate_case(
            "translategemma_auto_source",
            "Guten Morgen! ¿Cómo estás? Merci beaucoup.",
            Some("auto"),
            "ja",
        ),
        translate_case(
            "translategemma_mixed_source",
            "Guten Morgen! ¿Cómo estás? Merci beaucoup.",
            Some("mixed"),
            "en",
        ),
    ]
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden")
}

fn rendered(case: &Case) -> String {
    let prompt = Prompt::Chat(case.messages.clone());
    let req = RenderRequest {
        prompt: &prompt,
        thinking: case.thinking,
        translation: case.translation.as_ref(),
    };
    match render(case.format, &req) {
        Ok(Some(text)) => text,
        other => panic!("{}: expected a rendered prompt, got {other:?}", case.name),
    }
}

/// Compares every case of `format` with its golden file (or rewrites it under
/// `HANGAR_BLESS=1`), reporting all mismatches at once.
fn check_golden(format: PromptFormat) {
    let bless = std::env::var("HANGAR_BLESS").is_ok_and(|v| v == "1");
    let dir = golden_dir();
    let mut failures = Vec::new();
    let selected: Vec<Case> = cases().into_iter().filter(|c| c.format == format).collect();
    assert!(!selected.is_empty(), "no golden cases for {format:?}");
    for case in &selected {
        let actual = rendered(case);
        let path = dir.join(format!("{}.txt", case.name));
        if bless {
            std::fs::create_dir_all(&dir).expect("create golden dir");
            std::fs::write(&path, &actual).expect("write golden file");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!(
                "{}: rendered prompt differs from {}\n--- expected ---\n{expected:?}\n--- actual \
                 ---\n{actual:?}",
                case.name,
                path.display()
            )),
            Err(e) => failures.push(format!(
                "{}: cannot read {} ({e}); rendered:\n{actual:?}",
                case.name,
                path.display()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden mismatch(es); if the change is intended, rerun with HANGAR_BLESS=1 and review \
         the files:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn generic_matches_golden() {
    check_golden(PromptFormat::Generic);
}

#[test]
fn mistral_template_matches_golden() {
    check_golden(PromptFormat::MistralTemplate);
}

#[test]
fn qwen3_template_matches_golden() {
    check_golden(PromptFormat::Qwen3Template);
}

#[test]
fn gemma4_template_matches_golden() {
    check_golden(PromptFormat::Gemma4Template);
}

#[test]
fn translategemma_template_matches_golden() {
    check_golden(PromptFormat::TranslategemmaTemplate);
}

/// Every golden file belongs to a case (no stale files) and every case has a file.
#[test]
fn golden_files_and_cases_correspond() {
    if std::env::var("HANGAR_BLESS").is_ok_and(|v| v == "1") {
        return;
    }
    let mut files: Vec<String> = std::fs::read_dir(golden_dir())
        .expect("tests/golden exists")
        .map(|entry| entry.expect("dir entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = cases().iter().map(|c| format!("{}.txt", c.name)).collect();
    expected.sort();
    assert_eq!(files, expected);
}

/// The rendered text never carries BOS; the engine's tokenizer adds it per the GGUF.
#[test]
fn rendered_prompts_carry_no_bos() {
    for case in cases() {
        let text = rendered(&case);
        assert!(
            !text.starts_with("<s>") && !text.starts_with("<bos>"),
            "{} starts with a BOS token",
            case.name
        );
    }
    assert_eq!(expects_bos(PromptFormat::MistralTemplate), Some(true));
    assert_eq!(expects_bos(PromptFormat::Gemma4Template), Some(true));
    assert_eq!(expects_bos(PromptFormat::TranslategemmaTemplate), Some(true));
    assert_eq!(expects_bos(PromptFormat::Qwen3Template), Some(false));
    assert_eq!(expects_bos(PromptFormat::Auto), None);
}

const ALL_FORMATS: [PromptFormat; 6] = [
    PromptFormat::Generic,
    PromptFormat::MistralTemplate,
    PromptFormat::Qwen3Template,
    PromptFormat::Gemma4Template,
    PromptFormat::TranslategemmaTemplate,
    PromptFormat::Auto,
];

#[test]
fn raw_text_is_returned_as_is_for_every_format() {
    let prompt = Prompt::Text("  <s>[INST] already formatted [/INST]\n".to_owned());
    let translation = Translation { source_lang_code: None, target_lang_code: String::new() };
    for format in ALL_FORMATS {
        for thinking in [ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled] {
            let req = RenderRequest { prompt: &prompt, thinking, translation: Some(&translation) };
            assert_eq!(
                render(format, &req),
                Ok(Some("  <s>[INST] already formatted [/INST]\n".to_owned())),
                "{format:?}"
            );
        }
    }
}

#[test]
fn auto_chat_is_left_to_the_embedded_template() {
    let prompt = Prompt::Chat(single_turn());
    let req = RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
    assert_eq!(render(PromptFormat::Auto, &req), Ok(None));
}

#[test]
fn empty_messages_are_rejected() {
    let prompt = Prompt::Chat(Vec::new());
    let translation = translation(Some("en"), "de");
    let req = RenderRequest {
        prompt: &prompt,
        thinking: ThinkingMode::Default,
        translation: translation.as_ref(),
    };
    for format in ALL_FORMATS.into_iter().filter(|f| *f != PromptFormat::Auto) {
        assert_eq!(render(format, &req), Err(PromptError::EmptyMessages), "{format:?}");
    }
}

#[test]
fn capabilities_follow_the_spec() {
    for format in ALL_FORMATS {
        assert_eq!(
            multi_turn(format),
            format != PromptFormat::TranslategemmaTemplate,
            "multi_turn {format:?}"
        );
        let expected = if format == PromptFormat::Gemma4Template {
            vec![ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled]
        } else {
            vec![ThinkingMode::Default]
        };
        assert_eq!(thinking_modes(format), expected, "thinking_modes {format:?}");
    }
}

fn translate_err(messages: Vec<ChatMessage>, translation: Option<Translation>) -> PromptError {
    let prompt = Prompt::Chat(messages);
    let req = RenderRequest {
        prompt: &prompt,
        thinking: ThinkingMode::Default,
        translation: translation.as_ref(),
    };
    render(PromptFormat::TranslategemmaTemplate, &req).expect_err("must be rejected")
}

#[test]
fn translategemma_without_target_is_rejected() {
    let text = || vec![msg(Role::User, "Hello")];
    assert_eq!(translate_err(text(), None), PromptError::MissingTargetLanguage);
    assert_eq!(
        translate_err(text(), translation(Some("en"), "")),
        PromptError::MissingTargetLanguage
    );
    assert_eq!(translate_err(text(), translation(None, "  ")), PromptError::MissingTargetLanguage);
}

#[test]
fn translategemma_multi_turn_is_rejected() {
    let messages =
        vec![msg(Role::User, "Hello"), msg(Role::Assistant, "Hola"), msg(Role::User, "Goodbye")];
    assert_eq!(
        translate_err(messages, translation(Some("en"), "es")),
        PromptError::MultiTurnUnsupported { format: "translategemma_template" }
    );
}

#[test]
fn translategemma_rejects_system_and_non_user_messages() {
    let with_system = vec![msg(Role::System, "Be formal."), msg(Role::User, "Hello")];
    assert!(matches!(
        translate_err(with_system, translation(Some("en"), "es")),
        PromptError::UnsupportedRole { role: Role::System, .. }
    ));
    let assistant_only = vec![msg(Role::Assistant, "Hola")];
    assert!(matches!(
        translate_err(assistant_only, translation(Some("en"), "es")),
        PromptError::UnsupportedRole { role: Role::Assistant, .. }
    ));
}

#[test]
fn translategemma_unknown_codes_are_rejected() {
    let text = || vec![msg(Role::User, "Hello")];
    assert_eq!(
        translate_err(text(), translation(Some("xx"), "es")),
        PromptError::UnknownLanguageCode("xx".to_owned())
    );
    assert_eq!(
        translate_err(text(), translation(Some("en"), "klingon")),
        PromptError::UnknownLanguageCode("klingon".to_owned())
    );
    // `auto` and `mixed` describe a source, never a target.
    assert_eq!(
        translate_err(text(), translation(Some("en"), "auto")),
        PromptError::UnknownLanguageCode("auto".to_owned())
    );
    assert_eq!(
        translate_err(text(), translation(Some("en-"), "es")),
        PromptError::UnknownLanguageCode("en-".to_owned())
    );
}

#[test]
fn language_table_covers_common_languages_and_variants() {
    assert!(prompt::LANGUAGES.len() >= 50);
    assert!(prompt::LANGUAGES.windows(2).all(|w| w[0].0 < w[1].0), "sorted, unique codes");
    for (code, name) in [
        ("en", "English"),
        ("de", "German"),
        ("fr", "French"),
        ("es", "Spanish"),
        ("zh", "Chinese"),
        ("ja", "Japanese"),
        ("ar", "Arabic"),
        ("hi", "Hindi"),
        ("fil", "Filipino"),
    ] {
        assert_eq!(prompt::language_name(code), Some(name), "{code}");
    }
    let pt = prompt::language("pt_br").expect("pt_br");
    assert_eq!((pt.code.as_str(), pt.name), ("pt-BR", "Portuguese"));
    let zh = prompt::language("zh-hant-tw").expect("zh-hant-tw");
    assert_eq!((zh.code.as_str(), zh.name), ("zh-Hant-TW", "Chinese"));
    assert_eq!(prompt::language("EN").expect("EN").code, "en");
}

#[test]
fn mistral_requires_alternating_roles_after_the_system_prompt() {
    let render_mistral = |messages: Vec<ChatMessage>| {
        let prompt = Prompt::Chat(messages);
        let req =
            RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
        render(PromptFormat::MistralTemplate, &req)
    };
    let alternate = PromptError::RolesMustAlternate { format: "mistral_template" };
    assert_eq!(
        render_mistral(vec![msg(Role::User, "a"), msg(Role::User, "b")]),
        Err(alternate.clone())
    );
    assert_eq!(render_mistral(vec![msg(Role::Assistant, "a")]), Err(alternate));
    assert!(matches!(
        render_mistral(vec![msg(Role::User, "a"), msg(Role::System, "b")]),
        Err(PromptError::UnsupportedRole { role: Role::System, .. })
    ));
}

#[test]
fn formats_without_tool_ids_reject_tool_messages() {
    let messages = vec![
        msg(Role::User, "Weather?"),
        msg(Role::Assistant, ""),
        msg(Role::Tool, "{\"temp_c\": 3}"),
    ];
    let prompt = Prompt::Chat(messages);
    let req = RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
    for format in [PromptFormat::MistralTemplate, PromptFormat::Gemma4Template] {
        assert!(
            matches!(
                render(format, &req),
                Err(PromptError::UnsupportedRole { role: Role::Tool, .. })
            ),
            "{format:?}"
        );
    }
}

#[test]
fn errors_read_well() {
    assert_eq!(
        PromptError::UnsupportedRole {
            format: "gemma4_template",
            role: Role::Tool,
            reason: "here"
        }
        .to_string(),
        "gemma4_template does not accept a `tool` message here"
    );
    assert_eq!(
        PromptError::MissingTargetLanguage.to_string(),
        "translategemma_template needs a target_lang_code"
    );
}

/// Tool use renders as Qwen3's official template does with `tools=[…]`: the signatures in the
/// system turn, the earlier call as a `<tool_call>` block, the result as a `<tool_response>`.
/// The expected text is written out by hand from the template's `tools` branch.
#[test]
fn qwen3_tool_use_matches_the_official_template() {
    let tools = vec![ToolDefinition {
        name: "get_weather".to_owned(),
        description: Some("Current weather".to_owned()),
        parameters: serde_json::json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"]
        }),
    }];
    let mut call = ChatMessage::new(Role::Assistant, "");
    call.tool_calls.push(ToolCall {
        name: "get_weather".to_owned(),
        arguments: r#"{"city":"Paris"}"#.to_owned(),
    });
    let messages = vec![
        msg(Role::System, "You are helpful."),
        msg(Role::User, "Weather in Paris?"),
        call,
        msg(Role::Tool, r#"{"temp": 21}"#),
    ];
    let prompt = Prompt::Chat(with_tools(&messages, &tools));
    let req = RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
    let expected = concat!(
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to ",
        "assist with the user query.\n\nYou are provided with function signatures within ",
        "<tools></tools> XML tags:\n<tools>\n",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and ",
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n",
        r#"{"name": <function-name>, "arguments": <args-json-object>}"#,
        "\n</tool_call><|im_end|>\n",
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n",
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        "\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(render(PromptFormat::Qwen3Template, &req), Ok(Some(expected.to_owned())));
}

#[test]
fn tools_create_a_system_turn_and_leave_plain_chats_alone() {
    let tools = vec![ToolDefinition {
        name: "f".to_owned(),
        description: None,
        parameters: serde_json::json!({ "type": "object" }),
    }];
    let plain = single_turn();
    assert_eq!(with_tools(&plain, &[]), plain);
    let prepared = with_tools(&plain, &tools);
    assert_eq!(prepared.len(), 2);
    assert_eq!(prepared[0].role, Role::System);
    assert!(prepared[0].content.starts_with("# Tools\n"));
    assert!(prepared[0].content.contains(
        r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}"#
    ));
    assert_eq!(prepared[1], plain[0]);
}
