//! `POST /v1/completions`: a raw prompt, the `text_completion` answer and its chunk stream.

use bytes::Bytes;
use hangar_runtime::Work;
use hangar_runtime::engine::{FinishReason, GenerateRequest, GenerateSummary, Prompt, ToolCall};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sampling::{SamplingFields, StreamOptions};
use super::stream::{
    Generated, StreamFormat, data_event, done_event, generate_all, stream_generation,
};
use super::{Recorder, Reply, Usage, constant, new_id, shape, unix_now};
use crate::body::{Response, json_response, parse_json};
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::router::Ctx;

/// A completion prompt.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum CompletionPrompt {
    /// One prompt.
    Text(String),
    /// A list holding exactly one prompt (batches are not supported).
    Texts(#[schemars(length(min = 1, max = 1))] Vec<String>),
    /// Anything else (token arrays): refused with 400.
    #[schemars(skip)]
    Other(Value),
}

/// Body of `POST /v1/completions` (OpenAI's shape). Fields not listed here are accepted and
/// ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CompletionRequest {
    /// The configured model's name.
    #[schemars(required, length(min = 1))]
    model: Option<String>,
    /// The prompt: a string, or a list of exactly one string. Token arrays are refused.
    #[schemars(required)]
    prompt: Option<CompletionPrompt>,
    /// Most tokens to generate; without it, the model's `default_max_tokens`, else until
    /// the model stops or its context is full.
    #[schemars(range(min = 1))]
    max_tokens: Option<u32>,
    /// Sampling.
    #[serde(flatten)]
    sampling: SamplingFields,
    /// Answer with server-sent events (`text_completion` chunks, then `[DONE]`).
    stream: Option<bool>,
    /// Streaming options.
    stream_options: Option<StreamOptions>,
    /// Prepend the prompt to the completion.
    echo: Option<bool>,
}

constant!(
    /// `text_completion`.
    TextCompletionObject = "text_completion"
);

/// A completion, and each event of a streamed one.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Completion {
    /// Unique id (`cmpl-…`), the same in every chunk.
    id: String,
    /// Always `text_completion`.
    object: TextCompletionObject,
    /// Unix seconds.
    created: u64,
    /// The model.
    model: String,
    /// Always `null`.
    system_fingerprint: Option<String>,
    /// The one choice; empty in a stream's usage chunk.
    choices: Vec<CompletionChoice>,
    /// Token usage (in a stream: with `stream_options.include_usage`, `null` until the last
    /// chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

/// The choice of a completion.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CompletionChoice {
    /// The text (in a stream: this chunk's piece).
    text: String,
    /// Always 0.
    index: u32,
    /// Always `null`.
    logprobs: (),
    /// Why generation stopped; `null` in a stream until the last chunk.
    finish_reason: Option<crate::wire::FinishReason>,
}

/// `POST /v1/completions`.
pub(crate) async fn handle(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::Completions);
    let reply = completion(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn completion(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let route = hangar_runtime::engine::ForwardRoute::Completions;
    super::limits::check(ctx, rec, route)?;
    if let Some(reply) = super::forward::forwarded(ctx, rec, route).await {
        return reply;
    }
    let body: CompletionRequest = parse_json(&ctx.body, false)?;
    let model = rec.model(body.model)?;
    let prompt = match body.prompt {
        Some(CompletionPrompt::Text(text)) => text,
        Some(CompletionPrompt::Texts(mut texts)) if texts.len() == 1 => texts.remove(0),
        Some(CompletionPrompt::Texts(texts)) => {
            return Err(ApiError::bad_request(format!(
                "`prompt` must hold exactly one string (batches are not supported), got {}",
                texts.len()
            )));
        }
        Some(CompletionPrompt::Other(value)) => {
            return Err(ApiError::bad_request(format!(
                "`prompt` must be a string or an array of one string, got {}; token arrays are not supported",
                shape(&value)
            )));
        }
        None => return Err(ApiError::bad_request("`prompt` is required")),
    };
    let params = body.sampling.params((body.max_tokens, "max_tokens"))?;
    let echo = body.echo.unwrap_or(false).then(|| prompt.clone());
    let request = GenerateRequest { params, ..GenerateRequest::new(Prompt::Text(prompt)) };
    let guard = ctx.state.manager.admit(&model, Work::generation(&request)).await?;
    let mut format = CompletionStream {
        id: new_id("cmpl-"),
        created: unix_now(),
        model,
        include_usage: false,
        echo,
    };
    if body.stream.unwrap_or(false) {
        format.include_usage = body.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, summary, .. } = generate_all(guard, request, rec).await?;
    let text = match format.echo.take() {
        Some(prompt) => prompt + &text,
        None => text,
    };
    let choice = CompletionChoice {
        text,
        index: 0,
        logprobs: (),
        finish_reason: Some(summary.finish_reason.into()),
    };
    let answer = format.completion(vec![choice], Some(Some(Usage::of(&summary))));
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}

/// Writes `text_completion` chunk events (and builds the non-streamed answer).
struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// The prompt, to send first when `echo` is set.
    echo: Option<String>,
}

impl CompletionStream {
    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: TextCompletionObject::Value,
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage,
        }
    }

    fn chunk(
        &self,
        text: Option<&str>,
        finish: Option<FinishReason>,
        usage: Option<Usage>,
    ) -> Bytes {
        let choices = match text {
            Some(text) => vec![CompletionChoice {
                text: text.to_owned(),
                index: 0,
                logprobs: (),
                finish_reason: finish.map(Into::into),
            }],
            None => Vec::new(),
        };
        data_event(&self.completion(choices, self.include_usage.then_some(usage)))
    }
}

impl StreamFormat for CompletionStream {
    fn start(&mut self) -> Vec<Bytes> {
        match self.echo.take() {
            Some(prompt) => vec![self.chunk(Some(&prompt), None, None)],
            None => Vec::new(),
        }
    }

    fn delta(&mut self, text: &str) -> Vec<Bytes> {
        vec![self.chunk(Some(text), None, None)]
    }

    /// Completions have no tools, so engines never send calls here.
    fn tool_call(&mut self, _call: ToolCall) -> Vec<Bytes> {
        Vec::new()
    }

    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes> {
        let mut events = vec![self.chunk(Some(""), Some(summary.finish_reason), None)];
        if self.include_usage {
            events.push(self.chunk(None, None, Some(Usage::of(summary))));
        }
        events.push(done_event());
        events
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![data_event(&error.to_body()), done_event()]
    }
}
