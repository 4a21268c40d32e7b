//! `translategemma_template`: TranslateGemma's single user turn with Google's fixed
//! translation instruction, and its mixed-source mode.
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
//! from [`language`] (ISO 639-1 codes; a region or script variant such as `pt-BR` or
//! `zh-Hant` is named by its base language and keeps its full code in the parentheses).
//!
//! Mixed-source mode (spec, "TranslateGemma Request Notes"): when `source_lang_code` is
//! omitted, empty, `auto` or `mixed`, the structured prompt still names a valid source
//! language, [`MIXED_SOURCE_FALLBACK`] (English; Spanish when the target is English, see
//! [`mixed_source_fallback`]), and the user turn starts with a short
//! instruction (see [`mixed_source_instruction`]) asking the model to detect the source
//! language of each segment. System messages, more than one message, a missing target and
//! unknown codes are errors.

use hangar_backend::{ChatMessage, Role, Translation};
use hangar_config::PromptFormat;

use super::{Language, PromptError, format_name, language};

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

/// Renders the one user message of `messages` as a translation request per `translation`.
pub(super) fn render(
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

#[cfg(test)]
mod tests {
    use hangar_backend::{Prompt, ThinkingMode};

    use super::*;
    use crate::{self as prompt, RenderRequest};

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
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
        prompt::render(PromptFormat::TranslategemmaTemplate, &req)
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
}
