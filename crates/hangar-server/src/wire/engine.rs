//! What a model can do and how a generation ended.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An input modality a model accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    /// Text.
    Text,
    /// Images.
    Image,
}

/// A request-level thinking mode.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ThinkingMode {
    /// Keep the model's configured behaviour.
    #[default]
    Default,
    /// Ask the model to think.
    Enabled,
    /// Ask the model not to think.
    Disabled,
}

/// What a model supports, as the admin API reports it (the runtime's scheduling facts,
/// such as parallel sequences, stay off the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    /// Input modalities accepted.
    pub modalities: Vec<Modality>,
    /// Whether a multi-turn `messages` array is accepted.
    pub multi_turn: bool,
    /// Accepted values of request-level `thinking`; always includes `default`.
    pub thinking_modes: Vec<ThinkingMode>,
    /// Hangar's addition: how deeply the engine can sleep (`POST .../sleep`), lightest
    /// first — `context` (the KV cache and compute buffers go, the weights stay),
    /// `weights_to_host`, `weights_discarded`; left out when it cannot (it is unloaded
    /// instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sleep_levels: Vec<super::SleepLevel>,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model called tools.
    ToolCalls,
}

impl From<hangar_runtime::engine::Modality> for Modality {
    fn from(v: hangar_runtime::engine::Modality) -> Self {
        match v {
            hangar_runtime::engine::Modality::Text => Self::Text,
            hangar_runtime::engine::Modality::Image => Self::Image,
        }
    }
}

impl From<hangar_runtime::engine::ThinkingMode> for ThinkingMode {
    fn from(v: hangar_runtime::engine::ThinkingMode) -> Self {
        match v {
            hangar_runtime::engine::ThinkingMode::Default => Self::Default,
            hangar_runtime::engine::ThinkingMode::Enabled => Self::Enabled,
            hangar_runtime::engine::ThinkingMode::Disabled => Self::Disabled,
        }
    }
}

impl From<ThinkingMode> for hangar_runtime::engine::ThinkingMode {
    fn from(v: ThinkingMode) -> Self {
        match v {
            ThinkingMode::Default => Self::Default,
            ThinkingMode::Enabled => Self::Enabled,
            ThinkingMode::Disabled => Self::Disabled,
        }
    }
}

impl From<hangar_runtime::engine::Capabilities> for Capabilities {
    fn from(v: hangar_runtime::engine::Capabilities) -> Self {
        Self {
            modalities: v.modalities.into_iter().map(|x| x.into()).collect(),
            multi_turn: v.multi_turn,
            thinking_modes: v.thinking_modes.into_iter().map(|x| x.into()).collect(),
            sleep_levels: v.sleep_levels.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<hangar_runtime::engine::FinishReason> for FinishReason {
    fn from(v: hangar_runtime::engine::FinishReason) -> Self {
        match v {
            hangar_runtime::engine::FinishReason::Stop => Self::Stop,
            hangar_runtime::engine::FinishReason::Length => Self::Length,
            hangar_runtime::engine::FinishReason::ToolCalls => Self::ToolCalls,
        }
    }
}
