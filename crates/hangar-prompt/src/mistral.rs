//! `mistral_template`: Mistral's V7-Tekken instruct format.
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

use hangar_backend::{ChatMessage, Role};
use hangar_config::PromptFormat;

use super::{PromptError, format_name, reject_tools, split_system};

/// Renders `messages` (not empty) in V7-Tekken.
pub(super) fn render(messages: &[ChatMessage]) -> Result<String, PromptError> {
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
