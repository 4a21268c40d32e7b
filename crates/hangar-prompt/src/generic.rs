//! `generic`: Hangar's own plain transcript, for models without a known template.
//!
//! The transcript:
//! `System: …\nUser: …\nAssistant: …\nUser: …\nAssistant:` (one `Role: content` line per
//! message, content trimmed, an empty content leaving just `Role:`, ending with the bare
//! `Assistant:` cue). Tool results are `Tool: …` lines.

use hangar_backend::{ChatMessage, Role};

/// Renders `messages` (not empty) as the transcript.
pub(super) fn render(messages: &[ChatMessage]) -> String {
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
