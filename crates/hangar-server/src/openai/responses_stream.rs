//! The Responses API's event stream: typed events with an `event:` line naming each one.
//! The message item is opened by the first text (or at the end when there was neither text
//! nor a call), so a pure tool call streams only its `function_call` item.

use bytes::Bytes;
use hangar_runtime::engine::{GenerateSummary, ToolCall};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::new_id;
use super::responses::{OutputItem, OutputText, ResponseMeta, ResponseObject, ResponseStatus};
use super::stream::{StreamFormat, named_event};
use crate::error::ApiError;

/// One event of a streamed response; the SSE `event:` line repeats its `type`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr)]
#[serde(tag = "type")]
pub(crate) enum ResponseEvent {
    /// The response was created.
    #[serde(rename = "response.created")]
    #[strum(serialize = "response.created")]
    Created {
        /// Position in the stream.
        sequence_number: u64,
        /// The response so far.
        response: ResponseObject,
    },
    /// The response is being generated.
    #[serde(rename = "response.in_progress")]
    #[strum(serialize = "response.in_progress")]
    InProgress {
        /// Position in the stream.
        sequence_number: u64,
        /// The response so far.
        response: ResponseObject,
    },
    /// An output item began.
    #[serde(rename = "response.output_item.added")]
    #[strum(serialize = "response.output_item.added")]
    OutputItemAdded {
        /// Position in the stream.
        sequence_number: u64,
        /// The item's position in `output`.
        output_index: u32,
        /// The item.
        item: OutputItem,
    },
    /// A content part of the message began.
    #[serde(rename = "response.content_part.added")]
    #[strum(serialize = "response.content_part.added")]
    ContentPartAdded {
        /// Position in the stream.
        sequence_number: u64,
        /// The message item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The part's position in the message.
        content_index: u32,
        /// The part.
        part: OutputText,
    },
    /// More text.
    #[serde(rename = "response.output_text.delta")]
    #[strum(serialize = "response.output_text.delta")]
    OutputTextDelta {
        /// Position in the stream.
        sequence_number: u64,
        /// The message item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The part's position in the message.
        content_index: u32,
        /// The new text.
        delta: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// The arguments of a function call.
    #[serde(rename = "response.function_call_arguments.delta")]
    #[strum(serialize = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// Position in the stream.
        sequence_number: u64,
        /// The call item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The arguments (all of them: a call is streamed when complete).
        delta: String,
    },
    /// A function call's arguments are complete.
    #[serde(rename = "response.function_call_arguments.done")]
    #[strum(serialize = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// Position in the stream.
        sequence_number: u64,
        /// The call item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The arguments.
        arguments: String,
    },
    /// The message's text is complete.
    #[serde(rename = "response.output_text.done")]
    #[strum(serialize = "response.output_text.done")]
    OutputTextDone {
        /// Position in the stream.
        sequence_number: u64,
        /// The message item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The part's position in the message.
        content_index: u32,
        /// All the text.
        text: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A content part is complete.
    #[serde(rename = "response.content_part.done")]
    #[strum(serialize = "response.content_part.done")]
    ContentPartDone {
        /// Position in the stream.
        sequence_number: u64,
        /// The message item.
        item_id: String,
        /// The item's position in `output`.
        output_index: u32,
        /// The part's position in the message.
        content_index: u32,
        /// The part.
        part: OutputText,
    },
    /// An output item is complete.
    #[serde(rename = "response.output_item.done")]
    #[strum(serialize = "response.output_item.done")]
    OutputItemDone {
        /// Position in the stream.
        sequence_number: u64,
        /// The item's position in `output`.
        output_index: u32,
        /// The item.
        item: OutputItem,
    },
    /// The response completed.
    #[serde(rename = "response.completed")]
    #[strum(serialize = "response.completed")]
    Completed {
        /// Position in the stream.
        sequence_number: u64,
        /// The finished response.
        response: ResponseObject,
    },
    /// `max_output_tokens` cut the response short.
    #[serde(rename = "response.incomplete")]
    #[strum(serialize = "response.incomplete")]
    Incomplete {
        /// Position in the stream.
        sequence_number: u64,
        /// The finished response.
        response: ResponseObject,
    },
    /// The generation failed.
    #[serde(rename = "response.failed")]
    #[strum(serialize = "response.failed")]
    Failed {
        /// Position in the stream.
        sequence_number: u64,
        /// The failed response, `error` saying why.
        response: ResponseObject,
    },
}

/// Writes a response's events.
pub(crate) struct ResponsesStream {
    meta: ResponseMeta,
    sequence: u64,
    text: String,
    /// Whether the message item was announced (it is output item 0 then).
    message_open: bool,
    /// Calls streamed so far, with their `call_id`s.
    calls: Vec<(String, ToolCall)>,
}

impl ResponsesStream {
    pub(crate) fn new(meta: ResponseMeta) -> Self {
        Self { meta, sequence: 0, text: String::new(), message_open: false, calls: Vec::new() }
    }

    /// The next sequence number.
    fn seq(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence - 1
    }

    fn event(event: &ResponseEvent) -> Bytes {
        named_event(event.into(), event)
    }

    /// Announces the message item and its text part.
    fn open_message(&mut self) -> Vec<Bytes> {
        self.message_open = true;
        let item = self.meta.message(ResponseStatus::InProgress, None);
        let added =
            ResponseEvent::OutputItemAdded { sequence_number: self.seq(), output_index: 0, item };
        let part = ResponseEvent::ContentPartAdded {
            sequence_number: self.seq(),
            item_id: self.meta.message_id.clone(),
            output_index: 0,
            content_index: 0,
            part: OutputText::new(""),
        };
        vec![Self::event(&added), Self::event(&part)]
    }
}

impl StreamFormat for ResponsesStream {
    fn start(&mut self) -> Vec<Bytes> {
        let response = self.meta.in_progress();
        let created =
            ResponseEvent::Created { sequence_number: self.seq(), response: response.clone() };
        let progress = ResponseEvent::InProgress { sequence_number: self.seq(), response };
        vec![Self::event(&created), Self::event(&progress)]
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        let mut events = if self.message_open { Vec::new() } else { self.open_message() };
        self.text.push_str(text);
        let delta = ResponseEvent::OutputTextDelta {
            sequence_number: self.seq(),
            item_id: self.meta.message_id.clone(),
            output_index: 0,
            content_index: 0,
            delta: text.to_owned(),
            logprobs: Vec::new(),
        };
        events.push(Self::event(&delta));
        events
    }

    /// `output_item.added`, the arguments in one delta, `arguments.done`, `output_item.done`.
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes> {
        let output_index = (usize::from(self.message_open) + self.calls.len()) as u32;
        let call_id = new_id("call_");
        let pending = ToolCall { name: call.name.clone(), arguments: String::new() };
        let added = OutputItem::function_call(&call_id, &pending, ResponseStatus::InProgress);
        let done = OutputItem::function_call(&call_id, &call, ResponseStatus::Completed);
        let OutputItem::FunctionCall { id: item_id, .. } = &done else { return Vec::new() };
        let item_id = item_id.clone();
        let events = [
            ResponseEvent::OutputItemAdded {
                sequence_number: self.seq(),
                output_index,
                item: added,
            },
            ResponseEvent::FunctionCallArgumentsDelta {
                sequence_number: self.seq(),
                item_id: item_id.clone(),
                output_index,
                delta: call.arguments.clone(),
            },
            ResponseEvent::FunctionCallArgumentsDone {
                sequence_number: self.seq(),
                item_id,
                output_index,
                arguments: call.arguments.clone(),
            },
            ResponseEvent::OutputItemDone { sequence_number: self.seq(), output_index, item: done },
        ];
        self.calls.push((call_id, call));
        events.iter().map(Self::event).collect()
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut events = Vec::new();
        if !self.message_open && self.calls.is_empty() {
            events.extend(self.open_message());
        }
        let text = std::mem::take(&mut self.text);
        let calls = std::mem::take(&mut self.calls);
        let response = self.meta.finished(&text, self.message_open, &calls, summary);
        let status = response.status;
        if self.message_open {
            let item_id = self.meta.message_id.clone();
            let done = [
                ResponseEvent::OutputTextDone {
                    sequence_number: self.seq(),
                    item_id: item_id.clone(),
                    output_index: 0,
                    content_index: 0,
                    text: text.clone(),
                    logprobs: Vec::new(),
                },
                ResponseEvent::ContentPartDone {
                    sequence_number: self.seq(),
                    item_id,
                    output_index: 0,
                    content_index: 0,
                    part: OutputText::new(&text),
                },
                ResponseEvent::OutputItemDone {
                    sequence_number: self.seq(),
                    output_index: 0,
                    item: self.meta.message(status, Some(&text)),
                },
            ];
            events.extend(done.iter().map(Self::event));
        }
        let sequence_number = self.seq();
        let last = if status == ResponseStatus::Completed {
            ResponseEvent::Completed { sequence_number, response }
        } else {
            ResponseEvent::Incomplete { sequence_number, response }
        };
        events.push(Self::event(&last));
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        let failed = ResponseEvent::Failed {
            sequence_number: self.seq(),
            response: self.meta.failed(error),
        };
        vec![Self::event(&failed)]
    }
}
