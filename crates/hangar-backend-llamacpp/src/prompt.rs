//! Prompt formats: the shared renderers of [`hangar_prompt`], plus `auto`, the GGUF's
//! embedded chat template applied through llama.cpp (the engine takes it when
//! [`render`] answers `None`).

pub use hangar_prompt::*;

#[path = "prompt_auto.rs"]
pub(crate) mod auto;
