//! `auto`: the chat template embedded in the GGUF (`tokenizer.chat_template`), applied by
//! llama.cpp. The one prompt path that touches llama.cpp, so it is not golden-tested; the
//! engine takes it when [`render`](hangar_backend::prompt::render) answers `None`.

use hangar_backend::{ChatMessage, RuntimeError};
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};

/// Renders `messages` with `model`'s embedded chat template, ending with the generation
/// prompt.
///
/// # Errors
/// [`RuntimeError::InvalidRequest`] when the GGUF has no usable template, a message holds a
/// NUL byte, or llama.cpp cannot apply the template.
pub(crate) fn embedded_template(
    model: &LlamaModel,
    messages: &[ChatMessage],
) -> Result<String, RuntimeError> {
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
