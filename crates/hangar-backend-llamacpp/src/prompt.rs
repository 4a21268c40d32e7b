//! Prompt formats: how chat messages become the exact text a model was fine-tuned on.
//!
//! [`render`] turns a [`Prompt`] into text for every [`PromptFormat`] except `auto` (the
//! engine applies the GGUF's embedded chat template through llama.cpp for that one). The
//! functions here are pure Rust and do not touch llama.cpp, so they are tested byte for byte
//! against golden files (`tests/prompt_golden.rs`, `tests/golden/*.txt`).
//!
//! # Contract with the engine
//!
//! - **Raw text passes through.** A [`Prompt::Text`] (`/v1/completions`) is returned unchanged
//!   for every format, `auto` included.
//! - **No BOS in the text.** The rendered text never starts with a BOS token (`<s>`, `<bos>`):
//!   the engine tokenizes it with llama.cpp's `add_bos` as the GGUF says
//!   (`tokenizer.ggml.add_bos_token`, `llama_vocab_get_add_bos`) and with special-token parsing
//!   on, so that control tokens such as `[INST]`, `<|im_start|>` or `<|turn>` become single
//!   tokens. The official Mistral, Gemma 4 and TranslateGemma templates start with
//!   `bos_token`, Qwen3's does not; [`expects_bos`] says which, so the engine can warn when a
//!   GGUF disagrees.
//! - **Capabilities are checked before rendering.** [`multi_turn`] and [`thinking_modes`] give
//!   what the admin API reports; the server rejects a request that asks for more. The renderer
//!   itself ignores `thinking` for formats without a thinking control and ignores
//!   `translation` for every format except `translategemma_template`.
//! - **Tool messages.** Only `generic` and `qwen3_template` can place a [`Role::Tool`] message
//!   without the tool-call ids and names that [`ChatMessage`] does not carry; the other
//!   formats return [`PromptError::UnsupportedRole`] rather than silently dropping it.
//!
//! # The formats and their sources
//!
//! ## `generic`
//!
//! Hangar's own plain transcript for models without a known template:
//! `System: …\nUser: …\nAssistant: …\nUser: …\nAssistant:` (one `Role: content` line per
//! message, content trimmed, an empty content leaving just `Role:`, ending with the bare
//! `Assistant:` cue). Tool results are `Tool: …` lines.
//!
//! ## `mistral_template`
//!
//! Mistral's current instruct format, "V7-Tekken" (Mistral Small 3.1 / 3.2, e.g. the spec's
//! `mistral-small-3.2-24b-instruct-2506`): `[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT]` for an
//! optional leading system message, then `[INST]user[/INST]assistant</s>` pairs, with no
//! spaces around the control tokens, and no generation cue (the model answers right after
//! `[/INST]`). After the optional system message, roles must alternate user / assistant,
//! starting with a user message, as the official template enforces. Sources: the
//! `mistralai/Mistral-Small-3.1-24B-Instruct-2503` chat template (shipped in llama.cpp as
//! `models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja`), llama.cpp's
//! built-in `mistral-v7-tekken` template (`src/llama-chat.cpp`), and Mistral's cookbook
//! "Tokenization: Templates" (`mistralai/cookbook`, `concept-deep-dive/tokenization`).
//! Deliberate differences: the official template injects a dated default system prompt when
//! none is given; we do not (prompts stay deterministic). Older models on the V1/V3
//! SentencePiece tokenizers (Mistral 7B v0.1–v0.3, Mixtral, Nemo) use different spacing and
//! fold the system prompt into the last `[INST]`; configure those with `auto`.
//!
//! ## `qwen3_template`
//!
//! ChatML as Qwen3's official chat template writes it (`Qwen/Qwen3-*` `tokenizer_config.json`):
//! `<|im_start|>role\ncontent<|im_end|>\n` per message, and the generation prompt
//! `<|im_start|>assistant\n`. Thinking (implemented, though [`thinking_modes`] reports only
//! `default` for this format, as the spec lists no llama_cpp Qwen3 thinking control):
//! [`ThinkingMode::Disabled`] is the template's `enable_thinking=false` hard switch, which
//! pre-fills an empty think block (`<think>\n\n</think>\n\n`); `Default` and `Enabled` add
//! nothing (Qwen3 thinks by default).
//! The `/think` and `/no_think` soft switches are ordinary text in a user or system message
//! and pass through unchanged; the model honours them under `Default`/`Enabled` (with the hard
//! switch off they have no effect, as Qwen documents). Earlier assistant turns lose their
//! `<think>…</think>` part; an assistant message after the last user query that ends the
//! conversation keeps a (possibly empty) think block, as the template does. Tool results
//! become `<tool_response>` blocks inside one user turn.
//!
//! ## `gemma4_template`
//!
//! Gemma 4's control tokens, from Google's "Gemma 4 Prompt Formatting"
//! (<https://ai.google.dev/gemma/docs/core/prompt-formatting-gemma4>) and the official
//! `google/gemma-4-E2B-it` chat template (as checked into Ollama's
//! `model/renderers/testdata/gemma4_e2b_chat_template.jinja2`; llama.cpp ships an earlier
//! revision as `models/templates/gemma4.jinja`). Unlike Gemma 3 (`<start_of_turn>` turns, no
//! system role), Gemma 4 has `<|turn>role\n…<turn|>\n` turns with a real `system` role;
//! `assistant` is written `model`, contents are trimmed, and the generation prompt is
//! `<|turn>model\n`. Thinking is switched on by the `<|think|>` control token at the top of the
//! system turn (a system turn is opened for it when there is no system message):
//! [`ThinkingMode::Enabled`] writes `<|turn>system\n<|think|>\n…<turn|>\n`; `Default` and
//! `Disabled` leave it out (the template's default is `enable_thinking=false`). Earlier model
//! turns lose their `<|channel>…<channel|>` thoughts; consecutive assistant messages continue
//! one model turn. Assumption: the official 26B/31B templates additionally pre-fill an empty
//! thought channel (`<|channel>thought\n<channel|>`) when thinking is off, the E2B/E4B
//! templates do not, and pre-filling it regressed E2B/E4B output in Ollama (issue 15536); we
//! follow E2B/E4B, so a 26B/31B model with thinking off may still emit an empty thought
//! channel, which the engine's output handling should tolerate.
//!
//! ## `translategemma_template`
//!
//! TranslateGemma (`google/translategemma-*-it`, Gemma 3 based) accepts exactly one user
//! message carrying `source_lang_code` and `target_lang_code`; its chat template turns it into
//! one Gemma 3 user turn holding Google's fixed instruction, two blank lines, and the text:
//!
//! ```text
//! <start_of_turn>user
//! You are a professional {SOURCE_LANG} ({SOURCE_CODE}) to {TARGET_LANG} ({TARGET_CODE}) translator. Your goal is to accurately convey the meaning and nuances of the original {SOURCE_LANG} text while adhering to {TARGET_LANG} grammar, vocabulary, and cultural sensitivities.
//! Produce only the {TARGET_LANG} translation, without any additional explanations or commentary. Please translate the following {SOURCE_LANG} text into {TARGET_LANG}:
//!
//!
//! {TEXT}<end_of_turn>
//! <start_of_turn>model
//! ```
//!
//! Sources: the TranslateGemma model card (`huggingface.co/google/translategemma-4b-it`,
//! "Usage": user/assistant roles only, one content entry with both language codes) and the
//! prompt text as published in its prompt guides (Ollama's `translategemma` library page,
//! FastFlowLM's "TranslateGemma" model page), which agree word for word. Language names come
//! from [`language`] (ISO 639-1 codes; a region or script variant such as `pt-BR` or `zh-Hant`
//! is named by its base language and keeps its full code in the parentheses).
//!
//! Mixed-source mode (spec, "TranslateGemma Request Notes"): when `source_lang_code` is
//! omitted, empty, `auto` or `mixed`, the structured prompt still names a valid source
//! language, [`MIXED_SOURCE_FALLBACK`] (English; Spanish when the target is English, see
//! [`mixed_source_fallback`]), and the user turn starts with a short
//! instruction (see [`mixed_source_instruction`]) asking the model to detect the source
//! language of each segment. System messages, more than one message, a missing target and
//! unknown codes are errors.
//!
//! # Tool use
//!
//! [`with_tools`] prepares a chat for tool use before any format renders it, in the
//! Hermes / Qwen3 convention (the Qwen3 official chat template's `tools` branch, which most
//! tool-tuned GGUFs without a native format understand): the function signatures go into the
//! system message inside `<tools></tools>`, with the instruction to answer
//! `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`, and earlier assistant tool calls
//! are written back in that same form. JSON is written as Python's `json.dumps` does
//! (`", "` and `": "` separators, keys in the request's order), as the template's `tojson`.

use hangar_backend::{
    ChatMessage, Prompt, Role, ThinkingMode, ToolCall, ToolDefinition, Translation,
};
use hangar_config::PromptFormat;
use serde::Serialize;

/// What to render: the prompt plus the request-level controls that change it.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// The input: raw text or chat messages.
    pub prompt: &'a Prompt,
    /// Request-level thinking mode, already checked against [`thinking_modes`].
    pub thinking: ThinkingMode,
    /// TranslateGemma language codes; only `translategemma_template` reads them.
    pub translation: Option<&'a Translation>,
}

/// Why a prompt cannot be rendered in a format. Every variant is a client error (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// The chat has no messages.
    #[error("the request has no messages")]
    EmptyMessages,
    /// A single-turn format got more than one message.
    #[error("{format} is single-turn: send exactly one user message")]
    MultiTurnUnsupported {
        /// The format's config name.
        format: &'static str,
    },
    /// The format cannot place a message of this role (here).
    #[error("{format} does not accept a `{}` message {reason}", role_name(*.role))]
    UnsupportedRole {
        /// The format's config name.
        format: &'static str,
        /// The offending role.
        role: Role,
        /// Where or why, as a phrase (e.g. "after the first message").
        reason: &'static str,
    },
    /// The format requires user and assistant messages to alternate.
    #[error(
        "{format} needs the messages to alternate user/assistant/user/…, starting with a user \
         message, after an optional leading system message"
    )]
    RolesMustAlternate {
        /// The format's config name.
        format: &'static str,
    },
    /// A TranslateGemma request without a `target_lang_code`.
    #[error("translategemma_template needs a target_lang_code")]
    MissingTargetLanguage,
    /// A language code that is not in the table (or not a language, like `auto` as target).
    #[error("unknown language code {0:?}")]
    UnknownLanguageCode(String),
}

/// Renders `req` in `format`.
///
/// Returns `Ok(None)` only for `PromptFormat::Auto` with chat messages: the engine then applies
/// the GGUF's embedded chat template through llama.cpp. A [`Prompt::Text`] is returned as-is
/// for every format. The text never contains a BOS token (see the module docs).
pub fn render(
    format: PromptFormat,
    req: &RenderRequest<'_>,
) -> Result<Option<String>, PromptError> {
    let messages = match req.prompt {
        Prompt::Text(text) => return Ok(Some(text.clone())),
        Prompt::Chat(messages) => messages.as_slice(),
    };
    if format == PromptFormat::Auto {
        return Ok(None);
    }
    if messages.is_empty() {
        return Err(PromptError::EmptyMessages);
    }
    let text = match format {
        PromptFormat::Generic => render_generic(messages),
        PromptFormat::MistralTemplate => render_mistral(messages)?,
        PromptFormat::Qwen3Template => render_qwen3(messages, req.thinking),
        PromptFormat::Gemma4Template => render_gemma4(messages, req.thinking)?,
        PromptFormat::TranslategemmaTemplate => render_translategemma(messages, req.translation)?,
        PromptFormat::Auto => unreachable!("handled above"),
    };
    Ok(Some(text))
}

/// Opens a tool call in the model's output.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call in the model's output.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// The chat prepared for tool use (see "Tool use" in the module docs): `tools` (may be empty)
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
struct PythonFormatter;

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

/// Whether a format accepts a multi-turn `messages` array (`capabilities.multi_turn`): false
/// only for `translategemma_template`, which is single-turn.
pub fn multi_turn(format: PromptFormat) -> bool {
    !matches!(format, PromptFormat::TranslategemmaTemplate)
}

/// The request-level thinking modes a format accepts (`capabilities.thinking_modes`).
///
/// Per the runtime admin API spec ("capabilities.thinking_modes"), llama_cpp Gemma 4 is the
/// only llama_cpp format with a safe per-request control and reports
/// `[default, enabled, disabled]`; every other format, `qwen3_template` included (the spec
/// lists Qwen3 for vLLM, ExLlamaV3 and CT2 but not for llama_cpp), reports `[default]`.
/// [`render`] nevertheless implements Qwen3's `enable_thinking` switch, so widening Qwen3
/// here is a one-line change should the spec change.
pub fn thinking_modes(format: PromptFormat) -> Vec<ThinkingMode> {
    match format {
        PromptFormat::Gemma4Template => {
            vec![ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled]
        }
        PromptFormat::Generic
        | PromptFormat::MistralTemplate
        | PromptFormat::Qwen3Template
        | PromptFormat::TranslategemmaTemplate
        | PromptFormat::Auto => vec![ThinkingMode::Default],
    }
}

/// Whether the format's official chat template starts with the BOS token, i.e. whether the
/// model expects one BOS before the rendered text. The renderer never writes it; the engine's
/// tokenizer adds it when the GGUF's `add_bos` is set. `None` for `auto` (the embedded template
/// decides) and for `generic` (no official template).
pub fn expects_bos(format: PromptFormat) -> Option<bool> {
    match format {
        PromptFormat::MistralTemplate
        | PromptFormat::Gemma4Template
        | PromptFormat::TranslategemmaTemplate => Some(true),
        PromptFormat::Qwen3Template => Some(false),
        PromptFormat::Generic | PromptFormat::Auto => None,
    }
}

fn format_name(format: PromptFormat) -> &'static str {
    match format {
        PromptFormat::Generic => "generic",
        PromptFormat::MistralTemplate => "mistral_template",
        PromptFormat::Qwen3Template => "qwen3_template",
        PromptFormat::Gemma4Template => "gemma4_template",
        PromptFormat::TranslategemmaTemplate => "translategemma_template",
        PromptFormat::Auto => "auto",
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The leading system message, if any, and the rest.
fn split_system(messages: &[ChatMessage]) -> (Option<&ChatMessage>, &[ChatMessage]) {
    match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(first), rest),
        _ => (None, messages),
    }
}

fn reject_tools(format: PromptFormat, messages: &[ChatMessage]) -> Result<(), PromptError> {
    if messages.iter().any(|m| m.role == Role::Tool) {
        return Err(PromptError::UnsupportedRole {
            format: format_name(format),
            role: Role::Tool,
            reason: "(tool results need tool-call ids this request does not carry)",
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// generic

fn render_generic(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for message in messages {
        let label = match message.role {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
            Role::Tool => "Tool",
        };
        out.push_str(label);
        out.push(':');
        let content = message.content.trim();
        if !content.is_empty() {
            out.push(' ');
            out.push_str(content);
        }
        out.push('\n');
    }
    out.push_str("Assistant:");
    out
}

// ---------------------------------------------------------------------------------------------
// mistral_template (V7-Tekken)

fn render_mistral(messages: &[ChatMessage]) -> Result<String, PromptError> {
    let format = PromptFormat::MistralTemplate;
    reject_tools(format, messages)?;
    let (system, turns) = split_system(messages);
    let mut out = String::new();
    if let Some(system) = system {
        out.push_str("[SYSTEM_PROMPT]");
        out.push_str(&system.content);
        out.push_str("[/SYSTEM_PROMPT]");
    }
    for (i, message) in turns.iter().enumerate() {
        let user_turn = i % 2 == 0;
        match message.role {
            Role::System => {
                return Err(PromptError::UnsupportedRole {
                    format: format_name(format),
                    role: Role::System,
                    reason: "after the first message",
                });
            }
            Role::User if user_turn => {
                out.push_str("[INST]");
                out.push_str(&message.content);
                out.push_str("[/INST]");
            }
            Role::Assistant if !user_turn => {
                out.push_str(&message.content);
                out.push_str("</s>");
            }
            _ => return Err(PromptError::RolesMustAlternate { format: format_name(format) }),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// qwen3_template (ChatML)

const QWEN3_EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

fn render_qwen3(messages: &[ChatMessage], thinking: ThinkingMode) -> String {
    let mut out = String::new();
    let (system, _) = split_system(messages);
    if let Some(system) = system {
        out.push_str("<|im_start|>system\n");
        out.push_str(&system.content);
        out.push_str("<|im_end|>\n");
    }
    // The last real user query (a user message that is not a wrapped tool response); without
    // one the template keeps the last index.
    let last_query = messages
        .iter()
        .rposition(|m| {
            m.role == Role::User
                && !(m.content.starts_with("<tool_response>")
                    && m.content.ends_with("</tool_response>"))
        })
        .unwrap_or(messages.len() - 1);
    for (i, message) in messages.iter().enumerate() {
        match message.role {
            Role::System if i == 0 => {}
            Role::System | Role::User => {
                out.push_str("<|im_start|>");
                out.push_str(role_name(message.role));
                out.push('\n');
                out.push_str(&message.content);
                out.push_str("<|im_end|>\n");
            }
            Role::Assistant => {
                let (reasoning, content) = qwen3_split_think(&message.content);
                out.push_str("<|im_start|>assistant\n");
                let is_last = i + 1 == messages.len();
                if i > last_query && (is_last || !reasoning.is_empty()) {
                    out.push_str("<think>\n");
                    out.push_str(reasoning.trim_matches('\n'));
                    out.push_str("\n</think>\n\n");
                    out.push_str(content.trim_start_matches('\n'));
                } else {
                    out.push_str(content);
                }
                out.push_str("<|im_end|>\n");
            }
            Role::Tool => {
                let prev_is_tool = i > 0 && messages[i - 1].role == Role::Tool;
                if !prev_is_tool {
                    out.push_str("<|im_start|>user");
                }
                out.push_str("\n<tool_response>\n");
                out.push_str(&message.content);
                out.push_str("\n</tool_response>");
                let next_is_tool = messages.get(i + 1).is_some_and(|m| m.role == Role::Tool);
                if !next_is_tool {
                    out.push_str("<|im_end|>\n");
                }
            }
        }
    }
    out.push_str("<|im_start|>assistant\n");
    if thinking == ThinkingMode::Disabled {
        out.push_str(QWEN3_EMPTY_THINK);
    }
    out
}

/// Qwen3's split of an assistant message into (reasoning, answer):
/// `content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')` and
/// `content.split('</think>')[-1].lstrip('\n')`; no `</think>` → no reasoning.
fn qwen3_split_think(content: &str) -> (&str, &str) {
    let Some(first_end) = content.find("</think>") else {
        return ("", content);
    };
    let before = content[..first_end].trim_end_matches('\n');
    let reasoning = before.rsplit("<think>").next().unwrap_or(before).trim_start_matches('\n');
    let after_last = content.rsplit("</think>").next().unwrap_or("");
    (reasoning, after_last.trim_start_matches('\n'))
}

// ---------------------------------------------------------------------------------------------
// gemma4_template

fn render_gemma4(messages: &[ChatMessage], thinking: ThinkingMode) -> Result<String, PromptError> {
    reject_tools(PromptFormat::Gemma4Template, messages)?;
    let think = thinking == ThinkingMode::Enabled;
    let (system, turns) = split_system(messages);
    let mut out = String::new();
    if think || system.is_some() {
        out.push_str("<|turn>system\n");
        if think {
            out.push_str("<|think|>\n");
        }
        if let Some(system) = system {
            out.push_str(system.content.trim());
        }
        out.push_str("<turn|>\n");
    }
    for (i, message) in turns.iter().enumerate() {
        let is_model = message.role == Role::Assistant;
        let continues_previous = is_model && i > 0 && turns[i - 1].role == Role::Assistant;
        if !continues_previous {
            out.push_str("<|turn>");
            out.push_str(if is_model { "model" } else { role_name(message.role) });
            out.push('\n');
        }
        if is_model {
            out.push_str(&gemma4_strip_thinking(&message.content));
        } else {
            out.push_str(message.content.trim());
        }
        let continues_into_next =
            is_model && turns.get(i + 1).is_some_and(|m| m.role == Role::Assistant);
        if !continues_into_next {
            out.push_str("<turn|>\n");
        }
    }
    out.push_str("<|turn>model\n");
    Ok(out)
}

/// The template's `strip_thinking`: drops every `<|channel>…<channel|>` block, then trims.
fn gemma4_strip_thinking(text: &str) -> String {
    let mut result = String::new();
    for part in text.split("<channel|>") {
        match part.find("<|channel>") {
            Some(start) => result.push_str(&part[..start]),
            None => result.push_str(part),
        }
    }
    result.trim().to_owned()
}

// ---------------------------------------------------------------------------------------------
// translategemma_template

/// The source language the structured prompt names in mixed-source mode (source omitted,
/// `auto` or `mixed`): TranslateGemma's prompt needs a valid language, and the prepended
/// instruction tells the model to detect the real one per segment.
pub const MIXED_SOURCE_FALLBACK: &str = "en";

/// The fallback when the target itself is English: an "English to English" request invites the
/// model to copy its input instead of translating, so the placeholder source is Spanish there.
pub const MIXED_SOURCE_FALLBACK_FOR_ENGLISH: &str = "es";

/// The placeholder source language for a mixed-source request into `target`.
pub fn mixed_source_fallback(target: &Language) -> &'static str {
    let base = target.code.split('-').next().unwrap_or("");
    if base == MIXED_SOURCE_FALLBACK {
        MIXED_SOURCE_FALLBACK_FOR_ENGLISH
    } else {
        MIXED_SOURCE_FALLBACK
    }
}

/// The instruction prepended to the TranslateGemma user turn in mixed-source mode.
pub fn mixed_source_instruction(target: &Language) -> String {
    format!(
        "The text below may mix several source languages. Detect the source language of each \
         segment yourself and translate every segment into {name} ({code}); the source \
         language named in the next instruction is only a placeholder.\n\n",
        name = target.name,
        code = target.code,
    )
}

fn render_translategemma(
    messages: &[ChatMessage],
    translation: Option<&Translation>,
) -> Result<String, PromptError> {
    let format = PromptFormat::TranslategemmaTemplate;
    if messages.iter().any(|m| m.role == Role::System) {
        return Err(PromptError::UnsupportedRole {
            format: format_name(format),
            role: Role::System,
            reason: "(TranslateGemma has user and assistant roles only)",
        });
    }
    if messages.len() > 1 {
        return Err(PromptError::MultiTurnUnsupported { format: format_name(format) });
    }
    let message = &messages[0];
    if message.role != Role::User {
        return Err(PromptError::UnsupportedRole {
            format: format_name(format),
            role: message.role,
            reason: "(the one message must be the user's text to translate)",
        });
    }
    let translation = translation.ok_or(PromptError::MissingTargetLanguage)?;
    let target_code = translation.target_lang_code.trim();
    if target_code.is_empty() {
        return Err(PromptError::MissingTargetLanguage);
    }
    let target = language(target_code)?;
    let source = match translation.source_lang_code.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(code) if code.eq_ignore_ascii_case("auto") || code.eq_ignore_ascii_case("mixed") => {
            None
        }
        Some(code) => Some(language(code)?),
    };

    let mut out = String::from("<start_of_turn>user\n");
    let source = match source {
        Some(source) => source,
        None => {
            out.push_str(&mixed_source_instruction(&target));
            language(mixed_source_fallback(&target))?
        }
    };
    let (sn, sc, tn, tc) = (source.name, &source.code, target.name, &target.code);
    out.push_str(&format!(
        "You are a professional {sn} ({sc}) to {tn} ({tc}) translator. Your goal is to \
         accurately convey the meaning and nuances of the original {sn} text while adhering to \
         {tn} grammar, vocabulary, and cultural sensitivities.\n\
         Produce only the {tn} translation, without any additional explanations or commentary. \
         Please translate the following {sn} text into {tn}:\n\n\n"
    ));
    out.push_str(message.content.trim());
    out.push_str("<end_of_turn>\n<start_of_turn>model\n");
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// language codes

/// A resolved language: its normalized code and English name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Language {
    /// The code as the prompt writes it: base language in lower case, then any subtags
    /// (`pt-BR`, `zh-Hant`, `sr-Latn-RS`), `_` turned into `-`.
    pub code: String,
    /// The English name of the base language.
    pub name: &'static str,
}

/// ISO 639-1 codes (plus `fil`) and their English names: the 55 languages of TranslateGemma's
/// WMT24++ evaluation and the other widely used ones. Sorted by code.
pub const LANGUAGES: &[(&str, &str)] = &[
    ("af", "Afrikaans"),
    ("am", "Amharic"),
    ("ar", "Arabic"),
    ("az", "Azerbaijani"),
    ("be", "Belarusian"),
    ("bg", "Bulgarian"),
    ("bn", "Bengali"),
    ("bs", "Bosnian"),
    ("ca", "Catalan"),
    ("cs", "Czech"),
    ("cy", "Welsh"),
    ("da", "Danish"),
    ("de", "German"),
    ("el", "Greek"),
    ("en", "English"),
    ("eo", "Esperanto"),
    ("es", "Spanish"),
    ("et", "Estonian"),
    ("eu", "Basque"),
    ("fa", "Persian"),
    ("fi", "Finnish"),
    ("fil", "Filipino"),
    ("fr", "French"),
    ("ga", "Irish"),
    ("gl", "Galician"),
    ("gu", "Gujarati"),
    ("ha", "Hausa"),
    ("he", "Hebrew"),
    ("hi", "Hindi"),
    ("hr", "Croatian"),
    ("ht", "Haitian Creole"),
    ("hu", "Hungarian"),
    ("hy", "Armenian"),
    ("id", "Indonesian"),
    ("ig", "Igbo"),
    ("is", "Icelandic"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("jv", "Javanese"),
    ("ka", "Georgian"),
    ("kk", "Kazakh"),
    ("km", "Khmer"),
    ("kn", "Kannada"),
    ("ko", "Korean"),
    ("ku", "Kurdish"),
    ("ky", "Kyrgyz"),
    ("la", "Latin"),
    ("lb", "Luxembourgish"),
    ("lo", "Lao"),
    ("lt", "Lithuanian"),
    ("lv", "Latvian"),
    ("mg", "Malagasy"),
    ("mi", "Maori"),
    ("mk", "Macedonian"),
    ("ml", "Malayalam"),
    ("mn", "Mongolian"),
    ("mr", "Marathi"),
    ("ms", "Malay"),
    ("mt", "Maltese"),
    ("my", "Burmese"),
    ("nb", "Norwegian Bokmål"),
    ("ne", "Nepali"),
    ("nl", "Dutch"),
    ("nn", "Norwegian Nynorsk"),
    ("no", "Norwegian"),
    ("pa", "Punjabi"),
    ("pl", "Polish"),
    ("ps", "Pashto"),
    ("pt", "Portuguese"),
    ("ro", "Romanian"),
    ("ru", "Russian"),
    ("rw", "Kinyarwanda"),
    ("sd", "Sindhi"),
    ("si", "Sinhala"),
    ("sk", "Slovak"),
    ("sl", "Slovenian"),
    ("so", "Somali"),
    ("sq", "Albanian"),
    ("sr", "Serbian"),
    ("sv", "Swedish"),
    ("sw", "Swahili"),
    ("ta", "Tamil"),
    ("te", "Telugu"),
    ("tg", "Tajik"),
    ("th", "Thai"),
    ("tl", "Tagalog"),
    ("tr", "Turkish"),
    ("uk", "Ukrainian"),
    ("ur", "Urdu"),
    ("uz", "Uzbek"),
    ("vi", "Vietnamese"),
    ("xh", "Xhosa"),
    ("yi", "Yiddish"),
    ("yo", "Yoruba"),
    ("zh", "Chinese"),
    ("zu", "Zulu"),
];

/// The English name of a base language code (`"pt"` → `"Portuguese"`), case-insensitive.
pub fn language_name(base: &str) -> Option<&'static str> {
    LANGUAGES.iter().find(|(code, _)| code.eq_ignore_ascii_case(base)).map(|(_, name)| *name)
}

/// Resolves a BCP 47-style code (`de`, `pt-BR`, `pt_br`, `zh-Hant-TW`): the base language must
/// be in [`LANGUAGES`]; subtags must be 1–8 ASCII letters or digits. Regions are written in
/// upper case, scripts in title case; the name is the base language's.
pub fn language(code: &str) -> Result<Language, PromptError> {
    let unknown = || PromptError::UnknownLanguageCode(code.to_owned());
    let mut parts = code.trim().split(['-', '_']);
    let base = parts.next().unwrap_or("");
    let name = language_name(base).ok_or_else(unknown)?;
    let mut normalized = base.to_ascii_lowercase();
    for part in parts {
        if part.is_empty() || part.len() > 8 || !part.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(unknown());
        }
        normalized.push('-');
        match part.len() {
            2 if part.bytes().all(|b| b.is_ascii_alphabetic()) => {
                normalized.push_str(&part.to_ascii_uppercase());
            }
            4 if part.bytes().all(|b| b.is_ascii_alphabetic()) => {
                normalized.push_str(&part[..1].to_ascii_uppercase());
                normalized.push_str(&part[1..].to_ascii_lowercase());
            }
            _ => normalized.push_str(&part.to_ascii_lowercase()),
        }
    }
    Ok(Language { code: normalized, name })
}

#[cfg(test)]
mod tests {
    //! A compact copy of the golden cases, runnable with `cargo test --lib`.

    use super::*;

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    fn chat(format: PromptFormat, messages: Vec<ChatMessage>, thinking: ThinkingMode) -> String {
        let prompt = Prompt::Chat(messages);
        let req = RenderRequest { prompt: &prompt, thinking, translation: None };
        render(format, &req).expect("renders").expect("not auto")
    }

    fn translate(
        messages: Vec<ChatMessage>,
        source: Option<&str>,
        target: &str,
    ) -> Result<Option<String>, PromptError> {
        let prompt = Prompt::Chat(messages);
        let translation = Translation {
            source_lang_code: source.map(str::to_owned),
            target_lang_code: target.to_owned(),
        };
        let req = RenderRequest {
            prompt: &prompt,
            thinking: ThinkingMode::Default,
            translation: Some(&translation),
        };
        render(PromptFormat::TranslategemmaTemplate, &req)
    }

    #[test]
    fn text_passes_through_and_auto_is_not_rendered() {
        let prompt = Prompt::Text("  raw <s> text\n".into());
        let req =
            RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
        for format in [PromptFormat::Generic, PromptFormat::Gemma4Template, PromptFormat::Auto] {
            assert_eq!(render(format, &req).unwrap().as_deref(), Some("  raw <s> text\n"));
        }
        let prompt = Prompt::Chat(vec![msg(Role::User, "hi")]);
        let req =
            RenderRequest { prompt: &prompt, thinking: ThinkingMode::Default, translation: None };
        assert_eq!(render(PromptFormat::Auto, &req).unwrap(), None);
    }

    #[test]
    fn formats_render_as_their_templates() {
        let conv = || vec![msg(Role::System, "Be brief."), msg(Role::User, "Hi")];
        assert_eq!(
            chat(PromptFormat::Generic, conv(), ThinkingMode::Default),
            "System: Be brief.\nUser: Hi\nAssistant:"
        );
        assert_eq!(
            chat(PromptFormat::MistralTemplate, conv(), ThinkingMode::Default),
            "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]"
        );
        assert_eq!(
            chat(PromptFormat::Qwen3Template, conv(), ThinkingMode::Disabled),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        assert_eq!(
            chat(PromptFormat::Gemma4Template, conv(), ThinkingMode::Enabled),
            "<|turn>system\n<|think|>\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
        );
    }

    #[test]
    fn translategemma_prompt_and_errors() {
        let text = translate(vec![msg(Role::User, "Hallo")], Some("de"), "en-GB").unwrap().unwrap();
        assert_eq!(
            text,
            "<start_of_turn>user\nYou are a professional German (de) to English (en-GB) \
             translator. Your goal is to accurately convey the meaning and nuances of the \
             original German text while adhering to English grammar, vocabulary, and cultural \
             sensitivities.\nProduce only the English translation, without any additional \
             explanations or commentary. Please translate the following German text into \
             English:\n\n\nHallo<end_of_turn>\n<start_of_turn>model\n"
        );
        let mixed =
            translate(vec![msg(Role::User, "Hallo")], Some("MIXED"), "fr").unwrap().unwrap();
        assert!(mixed.starts_with("<start_of_turn>user\nThe text below may mix"));
        assert!(mixed.contains("professional English (en) to French (fr)"));
        assert_eq!(
            translate(vec![msg(Role::User, "x")], None, " "),
            Err(PromptError::MissingTargetLanguage)
        );
        assert_eq!(
            translate(vec![msg(Role::User, "x")], Some("xx"), "de"),
            Err(PromptError::UnknownLanguageCode("xx".into()))
        );
        assert!(matches!(
            translate(
                vec![msg(Role::User, "a"), msg(Role::Assistant, "b"), msg(Role::User, "c")],
                None,
                "de"
            ),
            Err(PromptError::MultiTurnUnsupported { .. })
        ));
    }

    #[test]
    fn language_codes_normalize() {
        assert_eq!(
            language("pt_br").unwrap(),
            Language { code: "pt-BR".into(), name: "Portuguese" }
        );
        assert_eq!(language("ZH-hant").unwrap().code, "zh-Hant");
        assert!(language("auto").is_err());
        assert!(language("en-").is_err());
        assert!(LANGUAGES.windows(2).all(|w| w[0].0 < w[1].0), "sorted, no duplicates");
    }

    #[test]
    fn capabilities_follow_the_spec() {
        assert!(!multi_turn(PromptFormat::TranslategemmaTemplate));
        assert!(multi_turn(PromptFormat::MistralTemplate));
        assert_eq!(thinking_modes(PromptFormat::Gemma4Template).len(), 3);
        assert_eq!(thinking_modes(PromptFormat::Qwen3Template), vec![ThinkingMode::Default]);
    }
}
