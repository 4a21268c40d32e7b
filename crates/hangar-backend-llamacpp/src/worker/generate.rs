//! A generation: the request's prompt text (tools prepared, rendered by the configured
//! format or the GGUF's embedded template), then the token loop — sample, stream, stop at
//! end-of-generation, a stop sequence, `max_tokens` or the context's end.

use hangar_backend::{
    FinishReason, GenerateEvent, GenerateRequest, GenerateSummary, Prompt, RuntimeError,
};
use hangar_config::ModelType;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use tokio::sync::{mpsc, oneshot};

use super::output::Output;
use super::utf8::take_utf8;
use super::{Worker, count, failed, sampling, unsupported};
use crate::prompt::{self, RenderRequest};
use crate::structured;

impl Worker<'_> {
    /// The prompt text: raw prompts as they are, chat through the configured format
    /// ([`prompt::render`]), or for `auto` through the GGUF's embedded template
    /// ([`prompt::auto`]).
    fn prompt_text(&self, request: &GenerateRequest) -> Result<String, RuntimeError> {
        let tools = request.tools.as_ref().map_or(&[][..], |t| t.tools.as_slice());
        let prepared;
        let prompt = match &request.prompt {
            Prompt::Chat(messages)
                if !tools.is_empty() || messages.iter().any(|m| !m.tool_calls.is_empty()) =>
            {
                prepared = Prompt::Chat(prompt::with_tools(messages, tools));
                &prepared
            }
            prompt => prompt,
        };
        let req = RenderRequest {
            prompt,
            thinking: request.thinking,
            translation: request.translation.as_ref(),
        };
        match prompt::render(self.spec.prompt_format, &req) {
            Ok(Some(text)) => Ok(text),
            Ok(None) => match prompt {
                Prompt::Chat(messages) => prompt::auto::embedded_template(self.model, messages),
                Prompt::Text(text) => Ok(text.clone()),
            },
            Err(e) => Err(RuntimeError::InvalidRequest { message: e.to_string() }),
        }
    }

    /// Generates for `request`, streaming text and tool calls to `events`, until
    /// end-of-generation, a stop sequence, a complete tool call, `max_tokens` (when set) or
    /// the end of the context (`Length`, not an error: OpenAI's and llama-server's `length`).
    /// Stops with [`RuntimeError::Cancelled`] once `events` or `reply` is dropped.
    pub(super) fn generate(
        &mut self,
        request: &GenerateRequest,
        events: &mpsc::Sender<GenerateEvent>,
        reply: &oneshot::Sender<Result<GenerateSummary, RuntimeError>>,
    ) -> Result<GenerateSummary, RuntimeError> {
        if self.spec.model_type != ModelType::Llm {
            return Err(unsupported("generate", self.spec.model_type));
        }
        let text = self.prompt_text(request)?;
        let prompt = self.tokenize(&text, true);
        if prompt.is_empty() {
            return Err(RuntimeError::InvalidRequest { message: "empty prompt".to_owned() });
        }
        if prompt.len() >= self.n_ctx() {
            return Err(RuntimeError::InvalidRequest {
                message: format!(
                    "prompt is {} tokens, the context holds {}",
                    prompt.len(),
                    self.n_ctx()
                ),
            });
        }
        // Without max_tokens the context is the only limit (as OpenAI and llama-server).
        let max_tokens = request.params.max_tokens;
        let constraint = structured::plan(request)?;
        let mut sampler = sampling::sampler(self.model, request, &constraint)?;
        let mut output = Output::new(&request.params.stop, &constraint);
        self.context.clear_kv_cache();
        self.decode(&prompt, 0, false)?;

        let mut n_past = prompt.len();
        let mut completion = 0u32;
        let mut pending_bytes: Vec<u8> = Vec::new();
        let model = self.model;
        let vocab = model.vocab();
        let cancelled = || events.is_closed() || reply.is_closed();
        let send =
            |event: GenerateEvent| events.blocking_send(event).map_err(|_| RuntimeError::Cancelled);
        let mut finish_reason = loop {
            if max_tokens.is_some_and(|max| completion >= max) || n_past >= self.n_ctx() {
                break FinishReason::Length;
            }
            if cancelled() {
                return Err(RuntimeError::Cancelled);
            }
            let mut candidates =
                LlamaTokenDataArray::from_iter(self.context.candidates_ith(-1), false);
            self.utf8.mask(&mut candidates, &pending_bytes);
            sampler.apply(&mut candidates);
            let Some(token) = candidates.selected_token() else {
                return Err(failed("the sampler selected no token"));
            };
            sampler.accept(token);
            if vocab.is_eog(token) {
                break FinishReason::Stop;
            }
            completion += 1;
            pending_bytes.extend(vocab.token_to_piece(token, false, None));
            let piece = take_utf8(&mut pending_bytes);
            let (text, stopped) = output.push(&piece);
            if !text.is_empty() {
                send(GenerateEvent::Text(text))?;
            }
            if stopped {
                break FinishReason::Stop;
            }
            self.decode(&[token], n_past, false)?;
            n_past += 1;
        };
        // The guard keeps `pending_bytes` a valid prefix: what is left is the start of a
        // character that max_tokens or the context's end cut off, not text.
        let (text, call) = output.finish();
        if !text.is_empty() {
            send(GenerateEvent::Text(text))?;
        }
        if let Some(call) = call {
            send(GenerateEvent::ToolCall(call))?;
            finish_reason = FinishReason::ToolCalls;
        }
        Ok(GenerateSummary {
            finish_reason,
            prompt_tokens: count(prompt.len()),
            completion_tokens: completion,
        })
    }
}
