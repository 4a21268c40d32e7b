//! `gemma4_template`: Gemma 4's `<|turn>` control tokens, with its `<|think|>` switch.
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

use hangar_backend::{ChatMessage, Role, ThinkingMode};
use hangar_config::PromptFormat;

use super::{PromptError, reject_tools, role_name, split_system};

/// Renders `messages` (not empty) as Gemma 4 turns.
pub(super) fn render(
    messages: &[ChatMessage],
    thinking: ThinkingMode,
) -> Result<String, PromptError> {
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
            out.push_str(&strip_thinking(&message.content));
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
fn strip_thinking(text: &str) -> String {
    let mut result = String::new();
    for part in text.split("<channel|>") {
        match part.find("<|channel>") {
            Some(start) => result.push_str(&part[..start]),
            None => result.push_str(part),
        }
    }
    result.trim().to_owned()
}
