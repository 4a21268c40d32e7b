//! `auto`: the chat template embedded in the GGUF (`tokenizer.chat_template`), rendered with
//! a Jinja engine ([`ChatTemplate`]) the way `llama-server --jinja` and Hugging Face's
//! `apply_chat_template` render it: default system prompts, tool sections and the rest as the
//! template defines them.
//!
//! Only a GGUF whose template minijinja cannot compile falls back to llama.cpp's built-in
//! template matcher (`llama_chat_apply_template`, which recognises a few dozen well-known
//! layouts by their markers and ignores everything else in the template); the admin row says
//! which one a replica uses ([`AutoTemplate::details`]).

use hangar_backend::{ChatMessage, RuntimeError, ToolDefinition};
use hangar_prompt::{ChatTemplate, with_tools};
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};

/// How `auto` renders a chat for one loaded GGUF.
#[derive(Debug)]
pub(crate) enum AutoTemplate {
    /// The GGUF's own template through minijinja (boxed: an environment is large).
    Jinja(Box<ChatTemplate>),
    /// llama.cpp's built-in matcher, and why the template could not be used.
    Builtin {
        /// Why not Jinja: no template in the GGUF, or minijinja's compile error.
        reason: String,
    },
}

impl AutoTemplate {
    /// Reads and compiles `model`'s embedded template (once per load).
    pub(crate) fn new(model: &LlamaModel) -> Self {
        let source = match model.meta_val_str("tokenizer.chat_template") {
            Ok(source) => source,
            Err(e) => {
                return Self::Builtin { reason: format!("the GGUF has no chat template: {e}") };
            }
        };
        let vocab = model.vocab();
        let text =
            |token| String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned();
        match ChatTemplate::new(&source, &text(vocab.bos()), &text(vocab.eos())) {
            Ok(template) => Self::Jinja(Box::new(template)),
            Err(e) => {
                tracing::warn!(error = %e, "the GGUF's chat template does not compile; using llama.cpp's built-in matcher");
                Self::Builtin { reason: format!("the chat template does not compile: {e}") }
            }
        }
    }

    /// The admin row's fields: `chat_template` (`jinja` or `llama.cpp built-in`) and, for the
    /// fallback, `chat_template_fallback` (why).
    pub(crate) fn details(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut details = serde_json::Map::new();
        match self {
            Self::Jinja(_) => {
                details.insert("chat_template".into(), "jinja".into());
            }
            Self::Builtin { reason } => {
                details.insert("chat_template".into(), "llama.cpp built-in".into());
                details.insert("chat_template_fallback".into(), reason.clone().into());
            }
        }
        details
    }

    /// Renders `messages` (with `tools`) ending with the generation prompt. A template that
    /// reads `tools` gets them; for any other the tools are described in the system message
    /// in the Hermes convention ([`with_tools`]), which Hangar's tool-call parser reads back.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidRequest`] with the template's own refusal (`raise_exception`)
    /// or the engine's error.
    pub(crate) fn render(
        &self,
        model: &LlamaModel,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
    ) -> Result<String, RuntimeError> {
        let uses_tools = !tools.is_empty() || messages.iter().any(|m| !m.tool_calls.is_empty());
        let reads_tools = matches!(self, Self::Jinja(template) if template.reads_tools());
        let described;
        let (messages, tools) = if uses_tools && !reads_tools {
            described = with_tools(messages, tools);
            (&described[..], &[][..])
        } else {
            (messages, tools)
        };
        match self {
            Self::Jinja(template) => {
                template.render(messages, tools).map_err(|e| RuntimeError::InvalidRequest {
                    message: format!("the model's chat template refused the chat: {e}"),
                })
            }
            Self::Builtin { .. } => builtin(model, messages),
        }
    }
}

/// Renders `messages` with llama.cpp's built-in matcher for `model`'s template.
fn builtin(model: &LlamaModel, messages: &[ChatMessage]) -> Result<String, RuntimeError> {
    let template = model.chat_template(None).map_err(|e| RuntimeError::InvalidRequest {
        message: format!("model has no usable embedded chat template: {e}"),
    })?;
    let chat = messages
        .iter()
        .map(|m| LlamaChatMessage::new(m.role.as_str().to_owned(), m.content.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::InvalidRequest { message: e.to_string() })?;
    model.apply_chat_template(&template, &chat, true).map_err(|e| RuntimeError::InvalidRequest {
        message: format!("llama.cpp cannot apply the embedded chat template: {e}"),
    })
}
