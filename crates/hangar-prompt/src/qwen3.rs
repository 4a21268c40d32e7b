//! `qwen3_template`: Qwen3's ChatML, with its `enable_thinking` switch.
//!
//! ChatML as Qwen3's official chat template writes it (`Qwen/Qwen3-*` `tokenizer_config.json`):
//! `<|im_start|>role\ncontent<|im_end|>\n` per message, and the generation prompt
//! `<|im_start|>assistant\n`. Thinking (implemented, though
//! [`thinking_modes`](super::thinking_modes) reports only `default` for this format, as the
//! spec lists no llama_cpp Qwen3 thinking control):
//! [`ThinkingMode::Disabled`] is the template's `enable_thinking=false` hard switch, which
//! pre-fills an empty think block (`<think>\n\n</think>\n\n`); `Default` and `Enabled` add
//! nothing (Qwen3 thinks by default).
//! The `/think` and `/no_think` soft switches are ordinary text in a user or system message
//! and pass through unchanged; the model honours them under `Default`/`Enabled` (with the hard
//! switch off they have no effect, as Qwen documents). Earlier assistant turns lose their
//! `<think>…</think>` part; an assistant message after the last user query that ends the
//! conversation keeps a (possibly empty) think block, as the template does. Tool results
//! become `<tool_response>` blocks inside one user turn.

use hangar_backend::{ChatMessage, Role, ThinkingMode};

use super::{role_name, split_system};

const EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

/// Renders `messages` (not empty) in ChatML, with Qwen3's thinking switch.
pub(super) fn render(messages: &[ChatMessage], thinking: ThinkingMode) -> String {
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
                let (reasoning, content) = split_think(&message.content);
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
        out.push_str(EMPTY_THINK);
    }
    out
}

/// Qwen3's split of an assistant message into (reasoning, answer):
/// `content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')` and
/// `content.split('</think>')[-1].lstrip('\n')`; no `</think>` → no reasoning.
fn split_think(content: &str) -> (&str, &str) {
    let Some(first_end) = content.find("</think>") else {
        return ("", content);
    };
    let before = content[..first_end].trim_end_matches('\n');
    let reasoning = before.rsplit("<think>").next().unwrap_or(before).trim_start_matches('\n');
    let after_last = content.rsplit("</think>").next().unwrap_or("");
    (reasoning, after_last.trim_start_matches('\n'))
}
