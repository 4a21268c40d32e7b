//! Pass-through of OpenAI-compatible requests to engines that serve that API themselves
//! (`llama-server`, `vllm serve`, remote servers): the client's body goes upstream as sent,
//! the answer comes back byte for byte, streams chunk by chunk.

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::{RuntimeError, ThinkingMode};

/// An OpenAI-compatible route a forwarding runtime passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardRoute {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/rerank`.
    Rerank,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages/count_tokens` (Anthropic's Messages API, which some engines serve).
    MessagesCountTokens,
    /// `POST /tokenize` at the server's root (llama-server's and vLLM's tokenizer).
    Tokenize,
    /// `POST /apply-template` at the server's root (llama-server: the chat template's prompt
    /// for a chat completion body).
    ApplyTemplate,
}

impl ForwardRoute {
    /// Whether an engine may lack the route: it is not part of the OpenAI API. Its 404,
    /// 405 or 501 is then [`RuntimeError::Unsupported`], not a bad request.
    pub fn optional(self) -> bool {
        matches!(self, Self::MessagesCountTokens | Self::Tokenize | Self::ApplyTemplate)
    }
}

/// A request to pass through.
#[derive(Debug, Clone)]
pub struct ForwardRequest {
    /// Which route.
    pub route: ForwardRoute,
    /// The client's JSON body, as sent.
    pub body: Bytes,
    /// Hangar's request-level `thinking`, which the runtime translates for its engine
    /// (for example into `chat_template_kwargs.enable_thinking`).
    pub thinking: ThinkingMode,
    /// Largest answer read whole (not streamed), in bytes (`limits.max_answer_bytes`); a
    /// larger one is [`RuntimeError::AnswerTooLarge`](crate::RuntimeError::AnswerTooLarge).
    pub max_answer_bytes: u64,
}

/// The engine's answer: status and content type as the engine sent them, and the body as it
/// arrives. Dropping `body` cancels the upstream request.
#[derive(Debug)]
pub struct ForwardResponse {
    /// HTTP status (always 2xx: failures are [`RuntimeError`]s).
    pub status: u16,
    /// The engine's `Content-Type`, if any.
    pub content_type: Option<String>,
    /// Chunks of the body in order; an `Err` ends it early (the engine failed mid-answer).
    pub body: mpsc::Receiver<Result<Bytes, RuntimeError>>,
}
