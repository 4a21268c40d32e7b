//! The answer as content blocks, whole or as the Messages API's event stream
//! (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`, `ping`, `error`).

use bytes::Bytes;
use hangar_runtime::engine::{FinishReason, GenerateSummary, ToolCall};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::split::{Piece, Splitter, signature};
use super::types::{
    AssistantRole, ErrorDetail, MessageOut, MessageType, OutputBlock, StopReason, Usage,
};
use crate::error::ApiError;
use crate::openai::new_id;
use crate::openai::stream::{StreamFormat, named_event};

/// A change to a content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub(crate) enum Delta {
    /// More text.
    #[serde(rename = "text_delta")]
    Text {
        /// The new text.
        text: String,
    },
    /// More reasoning.
    #[serde(rename = "thinking_delta")]
    Thinking {
        /// The new reasoning.
        thinking: String,
    },
    /// The reasoning's signature, before its block stops.
    #[serde(rename = "signature_delta")]
    Signature {
        /// The signature.
        signature: String,
    },
    /// A tool call's input (all of it: a call is streamed when complete).
    #[serde(rename = "input_json_delta")]
    InputJson {
        /// JSON text.
        partial_json: String,
    },
}

/// The end of a message.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct MessageDelta {
    /// Why it stopped.
    pub(crate) stop_reason: Option<StopReason>,
    /// The stop sequence that ended it.
    pub(crate) stop_sequence: Option<String>,
}

/// One event of a streamed message; the SSE `event:` line repeats its `type`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr)]
#[serde(tag = "type", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum StreamEvent {
    /// The message began (empty content; usage comes with `message_delta`).
    MessageStart {
        /// The message so far.
        message: MessageOut,
    },
    /// A content block began.
    ContentBlockStart {
        /// Its position in `content`.
        index: u32,
        /// The block, empty.
        content_block: OutputBlock,
    },
    /// Keeps the connection alive.
    Ping,
    /// A change to a content block.
    ContentBlockDelta {
        /// The block's position.
        index: u32,
        /// The change.
        delta: Delta,
    },
    /// A content block is complete.
    ContentBlockStop {
        /// The block's position.
        index: u32,
    },
    /// The message ended: why, and its usage.
    MessageDelta {
        /// Why it stopped.
        delta: MessageDelta,
        /// Token usage of the whole message.
        usage: Usage,
    },
    /// The last event.
    MessageStop,
    /// The generation failed after the stream began.
    Error {
        /// What went wrong.
        error: ErrorDetail,
    },
}

/// What becomes of the reasoning a model writes into its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reasoning {
    /// Thinking was turned off: the text is all answer.
    None,
    /// Thinking blocks with the reasoning.
    Shown,
    /// Thinking blocks with their signature only (`display: omitted`).
    Omitted,
}

/// The content of an answer as it is generated, and the events that build it.
pub(crate) struct Blocks {
    splitter: Splitter,
    omit: bool,
    content: Vec<OutputBlock>,
    /// Whether the last block of `content` is still open (text or thinking only).
    open: bool,
    /// The open thinking block's reasoning, when it is not shown.
    hidden: String,
}

impl Blocks {
    pub(crate) fn new(reasoning: Reasoning) -> Self {
        Self {
            splitter: Splitter::new(reasoning != Reasoning::None),
            omit: reasoning == Reasoning::Omitted,
            content: Vec::new(),
            open: false,
            hidden: String::new(),
        }
    }

    fn index(&self) -> u32 {
        u32::try_from(self.content.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Generated text.
    pub(crate) fn text(&mut self, text: &str) -> Vec<StreamEvent> {
        let pieces = self.splitter.push(text);
        pieces.into_iter().flat_map(|p| self.piece(p)).collect()
    }

    fn piece(&mut self, piece: Piece) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        let same = matches!(
            (self.content.last(), &piece),
            (Some(OutputBlock::Text { .. }), Piece::Text(_))
                | (Some(OutputBlock::Thinking { .. }), Piece::Thinking(_))
        );
        if !(self.open && same) {
            events.extend(self.close());
            let empty = match &piece {
                Piece::Text(_) => OutputBlock::Text { text: String::new() },
                Piece::Thinking(_) => {
                    OutputBlock::Thinking { thinking: String::new(), signature: String::new() }
                }
            };
            self.content.push(empty.clone());
            self.open = true;
            events
                .push(StreamEvent::ContentBlockStart { index: self.index(), content_block: empty });
        }
        let index = self.index();
        let delta = match (self.content.last_mut(), piece) {
            (Some(OutputBlock::Text { text }), Piece::Text(more)) => {
                text.push_str(&more);
                Delta::Text { text: more }
            }
            (Some(OutputBlock::Thinking { .. }), Piece::Thinking(more)) if self.omit => {
                self.hidden.push_str(&more);
                return events;
            }
            (Some(OutputBlock::Thinking { thinking, .. }), Piece::Thinking(more)) => {
                thinking.push_str(&more);
                Delta::Thinking { thinking: more }
            }
            _ => return events,
        };
        events.push(StreamEvent::ContentBlockDelta { index, delta });
        events
    }

    /// Closes the open block: a thinking block gets its signature first.
    fn close(&mut self) -> Vec<StreamEvent> {
        if !std::mem::take(&mut self.open) {
            return Vec::new();
        }
        let index = self.index();
        let mut events = Vec::new();
        let hidden = std::mem::take(&mut self.hidden);
        if let Some(OutputBlock::Thinking { thinking, signature: sig }) = self.content.last_mut() {
            *sig = signature(if self.omit { &hidden } else { thinking });
            events.push(StreamEvent::ContentBlockDelta {
                index,
                delta: Delta::Signature { signature: sig.clone() },
            });
        }
        events.push(StreamEvent::ContentBlockStop { index });
        events
    }

    /// Reasoning an engine sent apart from its text (`reasoning_content`).
    pub(crate) fn reasoning(&mut self, thinking: &str) -> Vec<StreamEvent> {
        if thinking.is_empty() {
            return Vec::new();
        }
        self.piece(Piece::Thinking(thinking.to_owned()))
    }

    /// A complete tool call: its block opens, takes its input and closes.
    pub(crate) fn tool_call(&mut self, call: &ToolCall) -> Vec<StreamEvent> {
        let mut events = self.close();
        let input: Value = serde_json::from_str(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(Map::new()));
        let id = new_id("toolu_");
        let start = OutputBlock::ToolUse {
            id: id.clone(),
            name: call.name.clone(),
            input: Value::Object(Map::new()),
        };
        self.content.push(OutputBlock::ToolUse {
            id,
            name: call.name.clone(),
            input: input.clone(),
        });
        let index = self.index();
        events.push(StreamEvent::ContentBlockStart { index, content_block: start });
        let partial_json = input.to_string();
        events.push(StreamEvent::ContentBlockDelta {
            index,
            delta: Delta::InputJson { partial_json },
        });
        events.push(StreamEvent::ContentBlockStop { index });
        events
    }

    /// The end of the text: what the splitter held, then the open block closed.
    pub(crate) fn finish(&mut self) -> Vec<StreamEvent> {
        let pieces = self.splitter.finish();
        let mut events: Vec<StreamEvent> = pieces.into_iter().flat_map(|p| self.piece(p)).collect();
        events.extend(self.close());
        events
    }

    /// The content, once finished.
    pub(crate) fn into_content(self) -> Vec<OutputBlock> {
        self.content
    }
}

/// What a message repeats from its request.
pub(crate) struct MessageMeta {
    pub(crate) id: String,
    pub(crate) model: String,
    /// The request's stop sequences, for the one that ended the answer.
    pub(crate) stops: Vec<String>,
}

impl MessageMeta {
    /// The message with `content`, finished by `summary` (or not yet: `None`).
    pub(crate) fn message(
        &self,
        content: Vec<OutputBlock>,
        summary: Option<&GenerateSummary>,
    ) -> MessageOut {
        let (stop_reason, stop_sequence) = summary.map_or((None, None), |s| self.stop(s));
        MessageOut {
            id: self.id.clone(),
            kind: MessageType::Value,
            role: AssistantRole::Value,
            model: self.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage: summary.map(usage).unwrap_or_default(),
        }
    }

    /// Why the generation stopped, and the stop sequence that stopped it.
    pub(crate) fn stop(&self, summary: &GenerateSummary) -> (Option<StopReason>, Option<String>) {
        match summary.finish_reason {
            FinishReason::ToolCalls => (Some(StopReason::ToolUse), None),
            FinishReason::Length => (Some(StopReason::MaxTokens), None),
            FinishReason::Stop => {
                let met = summary.stop_sequence.and_then(|i| self.stops.get(usize::from(i)));
                match met {
                    Some(stop) => (Some(StopReason::StopSequence), Some(stop.clone())),
                    None => (Some(StopReason::EndTurn), None),
                }
            }
        }
    }
}

/// Anthropic's usage of a generation: cached prompt tokens apart from the others.
pub(crate) fn usage(summary: &GenerateSummary) -> Usage {
    Usage {
        input_tokens: summary.prompt_tokens.saturating_sub(summary.cached_tokens),
        output_tokens: summary.completion_tokens,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: summary.cached_tokens,
    }
}

/// Writes a message's events.
pub(crate) struct MessagesStream {
    meta: MessageMeta,
    blocks: Blocks,
}

impl MessagesStream {
    pub(crate) fn new(meta: MessageMeta, reasoning: Reasoning) -> Self {
        Self { meta, blocks: Blocks::new(reasoning) }
    }
}

/// The `error` event that ends a stream which failed after it began.
pub(crate) fn error_event(error: &ApiError) -> Vec<Bytes> {
    events(vec![StreamEvent::Error { error: super::error_detail(error) }])
}

/// The SSE chunks of `events`, each named by its type.
pub(crate) fn events(events: Vec<StreamEvent>) -> Vec<Bytes> {
    events.iter().map(|e| named_event(e.into(), e)).collect()
}

impl StreamFormat for MessagesStream {
    fn start(&mut self) -> Vec<Bytes> {
        let message = self.meta.message(Vec::new(), None);
        events(vec![StreamEvent::MessageStart { message }, StreamEvent::Ping])
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        events(self.blocks.text(text))
    }

    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes> {
        events(self.blocks.tool_call(&call))
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut out = self.blocks.finish();
        let (stop_reason, stop_sequence) = self.meta.stop(summary);
        out.push(StreamEvent::MessageDelta {
            delta: MessageDelta { stop_reason, stop_sequence },
            usage: usage(summary),
        });
        out.push(StreamEvent::MessageStop);
        events(out)
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        error_event(error)
    }
}

/// The whole message of a finished generation.
pub(crate) fn whole(
    meta: &MessageMeta,
    reasoning: Reasoning,
    text: &str,
    calls: &[ToolCall],
    summary: &GenerateSummary,
) -> MessageOut {
    let mut blocks = Blocks::new(reasoning);
    blocks.text(text);
    blocks.finish();
    for call in calls {
        blocks.tool_call(call);
    }
    meta.message(blocks.into_content(), Some(summary))
}
