//! What a model can do and how a generation ended.

use std::num::NonZeroU32;

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

/// What a model supports, as the admin API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    /// Input modalities accepted.
    pub modalities: Vec<Modality>,
    /// Whether a multi-turn `messages` array is accepted.
    pub multi_turn: bool,
    /// Accepted values of request-level `thinking`; always includes `default`.
    pub thinking_modes: Vec<ThinkingMode>,
    /// Sequences one replica can run in parallel; `None` when the engine does not limit
    /// it. The scheduler clamps `target_inflight` to this.
    #[serde(skip)]
    pub max_parallel_sequences: Option<NonZeroU32>,
    /// Requests the scheduler may hand one replica beyond its in-flight target, for an
    /// engine that queues requests itself (a server process): it then starts the next
    /// request the moment one ends instead of idling for a round trip through Hangar. 0 for
    /// an engine that runs only what it is given.
    #[serde(skip)]
    pub dispatch_ahead: u32,
    /// Whether a generation can be resumed from text it already produced
    /// ([`GenerateRequest::resume`]); what a `retract` pause needs to put a running request
    /// back in the queue without its client noticing.
    #[serde(skip)]
    pub resumable: bool,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model called tools ([`GenerateEvent::ToolCall`]).
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
            max_parallel_sequences: v.max_parallel_sequences,
            dispatch_ahead: v.dispatch_ahead,
            resumable: v.resumable,
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
