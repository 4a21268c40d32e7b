//! [`Limits`]: the bounds Hangar puts on what one request may ask (`limits`).
//!
//! Every cap is far above what a real client sends — above OpenAI's own documented maxima,
//! so a request that OpenAI accepts is never refused here — and far below what would let one
//! request occupy an engine for minutes or fill memory: the request body limit alone
//! (`max_request_body_bytes`, 8 MiB) still admits millions of one-character embedding
//! inputs or stop strings.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// Default `limits.max_embedding_inputs`: twice OpenAI's 2,048 inputs per request.
pub const DEFAULT_MAX_EMBEDDING_INPUTS: u32 = 4_096;
/// Default `limits.max_rerank_documents`: four times the 1,000 documents Cohere recommends
/// and Voyage allows per request.
pub const DEFAULT_MAX_RERANK_DOCUMENTS: u32 = 4_096;
/// Default `limits.max_stop_sequences`: sixteen times OpenAI's 4.
pub const DEFAULT_MAX_STOP_SEQUENCES: u32 = 64;
/// Default `limits.max_stop_sequence_bytes`: longer than any delimiter a client uses.
pub const DEFAULT_MAX_STOP_SEQUENCE_BYTES: u32 = 1_024;
/// Default `limits.max_messages`: twice the 2,048 messages OpenAI accepts in a chat.
pub const DEFAULT_MAX_MESSAGES: u32 = 4_096;
/// Default `limits.max_tools`: four times OpenAI's 128 tools.
pub const DEFAULT_MAX_TOOLS: u32 = 512;
/// Default `limits.max_answer_bytes`, 256 MiB: above the largest answer the other caps let a
/// request ask for (4,096 embeddings of 4,096 dimensions in JSON, about 200 MB).
pub const DEFAULT_MAX_ANSWER_BYTES: u64 = 256 * 1024 * 1024;
/// Default `limits.max_log_line_bytes`, 16 KiB: longer than any line an engine prints about
/// itself, far shorter than a prompt echoed whole.
pub const DEFAULT_MAX_LOG_LINE_BYTES: u64 = 16 << 10;
/// Default `limits.max_log_bytes`, 4 MiB a model.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 4 << 20;
/// Default `limits.max_leases_per_model`.
pub const DEFAULT_MAX_LEASES_PER_MODEL: u32 = 64;

/// `limits` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LimitsFields {
    /// Most inputs of one embeddings request (`input` as a list). Default 4096 (OpenAI:
    /// 2048).
    #[schemars(range(min = 1))]
    max_embedding_inputs: Option<u32>,
    /// Most `documents` of one rerank request. Default 4096.
    #[schemars(range(min = 1))]
    max_rerank_documents: Option<u32>,
    /// Most `stop` sequences of one chat completion or completion. Default 64 (OpenAI: 4).
    #[schemars(range(min = 1))]
    max_stop_sequences: Option<u32>,
    /// Longest `stop` sequence, in UTF-8 bytes. Default 1024.
    #[schemars(range(min = 1))]
    max_stop_sequence_bytes: Option<u32>,
    /// Most chat `messages`, and most Responses API `input` items, of one request. Default
    /// 4096 (OpenAI: 2048).
    #[schemars(range(min = 1))]
    max_messages: Option<u32>,
    /// Most `tools` of one chat completion or response. Default 512 (OpenAI: 128).
    #[schemars(range(min = 1))]
    max_tools: Option<u32>,
    /// Most live leases one model may have at once; one more is refused with 429
    /// `too_many_leases`. Default 64.
    #[schemars(range(min = 1))]
    max_leases_per_model: Option<u32>,
    /// Largest answer, in bytes, Hangar reads whole from a forwarding engine (`llama-server`,
    /// `vllm serve`, a remote server); a larger one is cut and answered 502
    /// `upstream_answer_too_large`. Streamed answers pass through chunk by chunk and are not
    /// bounded. Default 268435456 (256 MiB).
    #[schemars(range(min = 1))]
    max_answer_bytes: Option<u64>,
    /// Seconds an admitted request may run (from the moment it gets its slot) before it is
    /// cancelled and answered 504 `deadline_exceeded` (a stream that already started ends
    /// with an error event). No deadline when unset.
    #[schemars(range(min = 1))]
    request_timeout_s: Option<u64>,
    /// Longest line of an engine's output (a child's stdout or stderr) kept in the model's
    /// log, in bytes: the rest of a longer one is dropped as it is read and the line ends
    /// with `… [N more bytes cut]`. Default 16384.
    #[schemars(range(min = 1))]
    max_log_line_bytes: Option<u64>,
    /// Bytes of text each model's log keeps, all lines together (older lines go first; at
    /// most 2,000 lines either way). At least `max_log_line_bytes`. Default 4194304 (4 MiB).
    #[schemars(range(min = 1))]
    max_log_bytes: Option<u64>,
}

impl Section for LimitsFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("max_embedding_inputs", self.max_embedding_inputs, 1);
        p.at_least("max_rerank_documents", self.max_rerank_documents, 1);
        p.at_least("max_stop_sequences", self.max_stop_sequences, 1);
        p.at_least("max_stop_sequence_bytes", self.max_stop_sequence_bytes, 1);
        p.at_least("max_messages", self.max_messages, 1);
        p.at_least("max_tools", self.max_tools, 1);
        p.at_least("max_leases_per_model", self.max_leases_per_model, 1);
        p.at_least("request_timeout_s", self.request_timeout_s, 1);
        p.at_least("max_answer_bytes", self.max_answer_bytes, 1);
        p.at_least("max_log_line_bytes", self.max_log_line_bytes, 1);
        let line = self.max_log_line_bytes.unwrap_or(DEFAULT_MAX_LOG_LINE_BYTES);
        if self.max_log_bytes.is_some_and(|total| total < line) {
            p.push("max_log_bytes", format!("must be >= max_log_line_bytes ({line})"));
        }
    }
}

/// The effective `limits`: each cap with its default applied. A request over a cap is
/// refused before anything reaches an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most inputs of one embeddings request.
    pub max_embedding_inputs: NonZeroU32,
    /// Most documents of one rerank request.
    pub max_rerank_documents: NonZeroU32,
    /// Most stop sequences of one request.
    pub max_stop_sequences: NonZeroU32,
    /// Longest stop sequence, in UTF-8 bytes.
    pub max_stop_sequence_bytes: NonZeroU32,
    /// Most chat messages, or Responses API input items, of one request.
    pub max_messages: NonZeroU32,
    /// Most tools of one request.
    pub max_tools: NonZeroU32,
    /// Most live leases of one model.
    pub max_leases_per_model: NonZeroU32,
    /// How long an admitted request may run; no deadline when `None`.
    pub request_timeout: Option<Duration>,
    /// Largest answer read whole from a forwarding engine, in bytes.
    pub max_answer_bytes: NonZeroU64,
    /// Longest line of an engine's output a model's log keeps, in bytes.
    pub max_log_line_bytes: NonZeroU64,
    /// Bytes of text a model's log keeps, all lines together.
    pub max_log_bytes: NonZeroU64,
}

impl Default for Limits {
    fn default() -> Self {
        Self::from(LimitsFields::default())
    }
}

impl From<LimitsFields> for Limits {
    fn from(f: LimitsFields) -> Self {
        // Zero is refused by `check`; the default stands in for it all the same.
        let cap = |v: Option<u32>, default: u32| {
            v.and_then(NonZeroU32::new).or(NonZeroU32::new(default)).unwrap_or(NonZeroU32::MIN)
        };
        let bytes = |v: Option<u64>, default: u64| {
            v.and_then(NonZeroU64::new).or(NonZeroU64::new(default)).unwrap_or(NonZeroU64::MIN)
        };
        Self {
            max_embedding_inputs: cap(f.max_embedding_inputs, DEFAULT_MAX_EMBEDDING_INPUTS),
            max_rerank_documents: cap(f.max_rerank_documents, DEFAULT_MAX_RERANK_DOCUMENTS),
            max_stop_sequences: cap(f.max_stop_sequences, DEFAULT_MAX_STOP_SEQUENCES),
            max_stop_sequence_bytes: cap(
                f.max_stop_sequence_bytes,
                DEFAULT_MAX_STOP_SEQUENCE_BYTES,
            ),
            max_messages: cap(f.max_messages, DEFAULT_MAX_MESSAGES),
            max_tools: cap(f.max_tools, DEFAULT_MAX_TOOLS),
            max_leases_per_model: cap(f.max_leases_per_model, DEFAULT_MAX_LEASES_PER_MODEL),
            request_timeout: f.request_timeout_s.filter(|&s| s > 0).map(Duration::from_secs),
            max_answer_bytes: bytes(f.max_answer_bytes, DEFAULT_MAX_ANSWER_BYTES),
            max_log_line_bytes: bytes(f.max_log_line_bytes, DEFAULT_MAX_LOG_LINE_BYTES),
            max_log_bytes: bytes(f.max_log_bytes, DEFAULT_MAX_LOG_BYTES),
        }
    }
}

impl Limits {
    /// The limits as `limits` is written in config, every default applied.
    pub fn to_json(&self) -> Value {
        json!({
            "max_embedding_inputs": self.max_embedding_inputs,
            "max_rerank_documents": self.max_rerank_documents,
            "max_stop_sequences": self.max_stop_sequences,
            "max_stop_sequence_bytes": self.max_stop_sequence_bytes,
            "max_messages": self.max_messages,
            "max_tools": self.max_tools,
            "max_leases_per_model": self.max_leases_per_model,
            "request_timeout_s": self.request_timeout.map(|d| d.as_secs()),
            "max_answer_bytes": self.max_answer_bytes,
            "max_log_line_bytes": self.max_log_line_bytes,
            "max_log_bytes": self.max_log_bytes,
        })
    }
}
