//! One generation as a [`Sequence`] of the replica's batch: the request's prompt tokens
//! (prepared off the worker, `prepare.rs`) with its sampler and output routing, checked before
//! it takes a slot; then, each time the batch
//! gives it logits, one token — sampled by its own sampler chain, streamed through its own
//! stop sequences and tool-call routing — until end-of-generation, a stop sequence,
//! `max_tokens` or the end of its context.

use std::collections::VecDeque;

use hangar_backend::{FinishReason, GenerateEvent, GenerateRequest, GenerateSummary, RuntimeError};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use super::output::Output;
use super::prepare::Prepared;
use super::utf8::{Utf8Guard, take_utf8};
use super::{Worker, count, failed};
use crate::structured;

/// Where a generation's answer goes.
pub(super) type Reply = oneshot::Sender<Result<GenerateSummary, RuntimeError>>;

/// A generation in the batch: its prompt, sampler, output routing and progress.
pub(super) struct Sequence {
    events: mpsc::Sender<GenerateEvent>,
    reply: Reply,
    sampler: LlamaSampler,
    output: Output,
    max_tokens: Option<u32>,
    /// The whole prompt: the request's, then the tokens of its `resume` text.
    pub(super) prompt: Vec<LlamaToken>,
    /// Tokens of the request's own prompt (the usage's `prompt_tokens`).
    own_prompt: usize,
    /// Prompt tokens already in the sequence's KV cells (reused or decoded).
    pub(super) fed: usize,
    /// Prompt tokens whose cells an earlier sequence left in the slot (not decoded again).
    pub(super) reused: usize,
    /// Tokens in the sequence's KV cells: the position of the next token to decode.
    pub(super) n_past: usize,
    /// The sampled token that the next step decodes.
    pub(super) next: Option<LlamaToken>,
    completion: u32,
    /// Bytes of a character not yet complete.
    pending_bytes: Vec<u8>,
    /// Events the client's channel had no room for yet, in order.
    outbox: VecDeque<GenerateEvent>,
    /// The answer, once the generation ended; sent after the last event.
    done: Option<Result<GenerateSummary, RuntimeError>>,
}

/// What a sequence does next, from the batch's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// It has prompt tokens to decode.
    Prompt,
    /// It has a sampled token to decode.
    Decode,
    /// It waits for its client to take events (a slow reader holds back only itself).
    Blocked,
    /// Its answer is out (or its client left): the slot is free.
    Gone,
}

impl Worker<'_> {
    /// A sequence for `request`, whose prompt is `prepared` (tokenized and checked against
    /// the context before the command was sent), or why it cannot start: a schema llama.cpp
    /// cannot turn into a grammar. Nothing of the batch is touched before these checks pass.
    pub(super) fn sequence(
        &self,
        request: &GenerateRequest,
        prepared: Prepared,
        events: mpsc::Sender<GenerateEvent>,
        reply: Reply,
    ) -> Result<Sequence, (Reply, RuntimeError)> {
        let checked = (|| {
            let constraint = structured::plan(request)?;
            let sampler = super::sampling::sampler(self.model, request, &constraint)?;
            let output = Output::new(&request.params.stop, &constraint);
            Ok((sampler, output))
        })();
        let Prepared { prompt, own_prompt } = prepared;
        match checked {
            Ok((sampler, output)) => Ok(Sequence {
                events,
                reply,
                sampler,
                output,
                // Without max_tokens the context is the only limit (as OpenAI and llama-server).
                max_tokens: request.params.max_tokens,
                completion: count(prompt.len() - own_prompt),
                prompt,
                own_prompt,
                fed: 0,
                reused: 0,
                n_past: 0,
                next: None,
                pending_bytes: Vec::new(),
                outbox: VecDeque::new(),
                done: None,
            }),
            Err(e) => Err((reply, e)),
        }
    }
}

impl Sequence {
    /// Where it stands; first hands what events its client has room for.
    pub(super) fn phase(&mut self) -> Phase {
        if self.reply.is_closed() || self.events.is_closed() {
            return Phase::Gone;
        }
        while let Some(event) = self.outbox.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.outbox.push_front(event);
                    return Phase::Blocked;
                }
                Err(TrySendError::Closed(_)) => return Phase::Gone,
            }
        }
        if self.done.is_some() {
            return Phase::Gone;
        }
        if self.fed < self.prompt.len() { Phase::Prompt } else { Phase::Decode }
    }

    /// Sends the answer (when the generation ended and its client still listens) and frees
    /// the sequence. A client that left gets [`RuntimeError::Cancelled`] if anyone listens.
    pub(super) fn retire(self) {
        let answer = match self.done {
            Some(answer) if self.outbox.is_empty() => answer,
            _ => Err(RuntimeError::Cancelled),
        };
        let _ = self.reply.send(answer);
    }

    /// Ends the sequence with `error` (a failed decode).
    pub(super) fn fail(mut self, error: RuntimeError) {
        self.outbox.clear();
        self.done = Some(Err(error));
        self.retire();
    }

    /// Takes one token from the logits at batch index `i`: checks the limits, samples,
    /// routes the text. Returns whether the sequence goes on (with [`Self::next`] to decode).
    pub(super) fn step(
        &mut self,
        context: &LlamaContext<'_>,
        i: i32,
        model: &LlamaModel,
        utf8: &Utf8Guard,
        n_ctx: usize,
    ) -> Result<bool, RuntimeError> {
        self.next = None;
        if self.max_tokens.is_some_and(|max| self.completion >= max) || self.n_past >= n_ctx {
            self.finish(FinishReason::Length);
            return Ok(false);
        }
        let mut candidates = LlamaTokenDataArray::from_iter(context.candidates_ith(i), false);
        utf8.mask(&mut candidates, &self.pending_bytes);
        self.sampler.apply(&mut candidates);
        let Some(token) = candidates.selected_token() else {
            return Err(failed("the sampler selected no token"));
        };
        self.sampler.accept(token);
        let vocab = model.vocab();
        if vocab.is_eog(token) {
            self.finish(FinishReason::Stop);
            return Ok(false);
        }
        self.completion += 1;
        self.pending_bytes.extend(vocab.token_to_piece(token, false, None));
        let piece = take_utf8(&mut self.pending_bytes);
        let (text, stopped) = self.output.push(&piece);
        if !text.is_empty() {
            self.outbox.push_back(GenerateEvent::Text(text));
        }
        if stopped {
            self.finish(FinishReason::Stop);
            return Ok(false);
        }
        self.next = Some(token);
        Ok(true)
    }

    /// Ends the generation: flushes what the output held back, turns a complete tool call
    /// into its event. The guard keeps `pending_bytes` a valid prefix: what is left is the
    /// start of a character that `max_tokens` or the context's end cut off, not text.
    fn finish(&mut self, mut finish_reason: FinishReason) {
        let (text, call) = self.output.finish();
        if !text.is_empty() {
            self.outbox.push_back(GenerateEvent::Text(text));
        }
        if let Some(call) = call {
            self.outbox.push_back(GenerateEvent::ToolCall(call));
            finish_reason = FinishReason::ToolCalls;
        }
        let stop_sequence = (finish_reason == FinishReason::Stop)
            .then(|| self.output.stop_sequence())
            .flatten()
            .and_then(|i| u16::try_from(i).ok());
        self.done = Some(Ok(GenerateSummary {
            finish_reason,
            prompt_tokens: count(self.own_prompt),
            completion_tokens: self.completion,
            cached_tokens: count(self.reused),
            stop_sequence,
        }));
    }
}
