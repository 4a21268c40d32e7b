//! Hangar's prompt formats: how chat messages become the exact text a model was fine-tuned on.
//!
//! [`render`] turns a [`Prompt`] into text for every [`PromptFormat`] except `auto` (the
//! engine applies the model's own chat template for that one: llama.cpp the GGUF's, a Python
//! engine its tokenizer's). The renderers are pure Rust, shared by every engine that takes
//! rendered text (in-process llama.cpp, the Python bridge), and tested byte for byte against
//! golden files (`tests/it/prompt_golden.rs`, `tests/golden/*.txt`).
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
//! One module per format, whose docs give the exact layout, the official template it follows
//! and any deliberate difference:
//!
//! - `generic.rs` — Hangar's own `System: …\nUser: …\nAssistant:` transcript.
//! - `mistral.rs` — `mistral_template`, Mistral's V7-Tekken (`[SYSTEM_PROMPT]`, `[INST]`).
//! - `qwen3.rs` — `qwen3_template`, Qwen3's ChatML with its `enable_thinking` switch.
//! - `gemma4.rs` — `gemma4_template`, Gemma 4's `<|turn>` tokens with its `<|think|>` switch.
//! - `translategemma.rs` — `translategemma_template`, one user turn with Google's fixed
//!   translation instruction, and the mixed-source mode ([`MIXED_SOURCE_FALLBACK`]); language
//!   codes resolve through [`language`] (`languages.rs`).
//! - `auto` — the model's own template, applied by the engine when [`render`] answers `None`.
//!
//! # Tool use
//!
//! [`with_tools`] (`tools.rs`) prepares a chat for tool use before any format renders it, in
//! the Hermes / Qwen3 convention: the function signatures go into the system message inside
//! `<tools></tools>`, and earlier assistant tool calls are written back as
//! [`TOOL_CALL_OPEN`] … [`TOOL_CALL_CLOSE`] blocks.

mod gemma4;
mod generic;
mod jinja;
mod languages;
mod mistral;
mod qwen3;
mod tools;
mod translategemma;

use hangar_backend::{ChatMessage, Prompt, Role, ThinkingMode, Translation};
use hangar_config::PromptFormat;

pub use self::jinja::ChatTemplate;
pub use self::languages::{LANGUAGES, Language, language, language_name};
pub use self::tools::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN, python_json, tool_call_text, with_tools};
pub use self::translategemma::{
    MIXED_SOURCE_FALLBACK, MIXED_SOURCE_FALLBACK_FOR_ENGLISH, mixed_source_fallback,
    mixed_source_instruction,
};

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
        PromptFormat::Generic => generic::render(messages),
        PromptFormat::MistralTemplate => mistral::render(messages)?,
        PromptFormat::Qwen3Template => qwen3::render(messages, req.thinking),
        PromptFormat::Gemma4Template => gemma4::render(messages, req.thinking)?,
        PromptFormat::TranslategemmaTemplate => translategemma::render(messages, req.translation)?,
        PromptFormat::Auto => unreachable!("handled above"),
    };
    Ok(Some(text))
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
    format.as_str()
}

fn role_name(role: Role) -> &'static str {
    role.as_str()
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
    fn capabilities_follow_the_spec() {
        assert!(!multi_turn(PromptFormat::TranslategemmaTemplate));
        assert!(multi_turn(PromptFormat::MistralTemplate));
        assert_eq!(thinking_modes(PromptFormat::Gemma4Template).len(), 3);
        assert_eq!(thinking_modes(PromptFormat::Qwen3Template), vec![ThinkingMode::Default]);
    }
}
