//! Anthropic's Messages API beside the OpenAI one: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`.
//!
//! A request takes the OpenAI routes' steps (`openai/mod.rs`): its lists checked against
//! `limits`, the typed body parsed, the model named, the conversation turned into the
//! engines' typed request (`convert.rs`), admitted by the manager with the same state rules,
//! generated, and answered as content blocks (`stream.rs`), the reasoning a model writes
//! into its text split into thinking blocks (`split.rs`). Errors answer in Anthropic's
//! envelope, `{"type": "error", "error": {"type", "message", "code"}}`, with Hangar's code
//! kept inside; the status is Hangar's, as on every route.
//!
//! Models whose engine takes OpenAI requests (`llama_server`, `vllm_serve`, `openai_remote`)
//! get the same typed request written as a chat completion, and their answer read back
//! (`forward.rs`), and their tokens counted by the engine (`count.rs`). Image blocks go
//! only to those engines, and only where the model takes images.

mod convert;
mod count;
mod forward;
mod split;
mod stream;
pub(crate) mod types;

use std::sync::LazyLock;

use hangar_config::BackendKind;
use hangar_runtime::engine::Modality;
use hangar_runtime::{ManagerError, Work};
use http::StatusCode;
use serde_json::json;

use self::stream::{MessageMeta, MessagesStream, Reasoning, StreamEvent};
use self::types::{
    Conversation, ErrorDetail, ErrorEnvelope, ErrorType, MessagesRequest, TokenCount,
};
use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, ErrorCode, RuntimeCode};
use crate::metrics::Endpoint;
use crate::openai::stream::{Generated, generate_all, stream_generation};
use crate::openai::{Recorder, Reply, new_id};
use crate::router::{Ctx, Group, HandlerFuture, Route};

/// `POST /v1/messages`.
async fn messages(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::Messages);
    let reply = message(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn message(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    crate::openai::limits::check_messages(ctx, rec)?;
    let (stream, converted) = parsed(ctx, |body| {
        convert::check_tags(&parse_json(body, false)?)?;
        let body: MessagesRequest = parse_json(body, false)?;
        let stream = body.stream.unwrap_or(false);
        Ok((stream, convert::request(body)?))
    })
    .await?;
    let convert::Converted { model, request, stops, omit_thinking, images } = converted;
    let model = rec.model(model)?;
    let kind = check_images(ctx, &model, &images)?;
    let reasoning = match request.thinking {
        hangar_runtime::engine::ThinkingMode::Disabled => Reasoning::None,
        _ if omit_thinking => Reasoning::Omitted,
        _ => Reasoning::Shown,
    };
    let guard = ctx.state.manager.admit(&model, Work::generation(&request)).await?;
    let meta = MessageMeta { id: new_id("msg_"), model, stops };
    if guard.forwards() {
        let forwarded = forward::Forwarded { request, images, kind };
        return forward::message(guard, forwarded, meta, reasoning, stream, ctx, rec).await;
    }
    if stream {
        let format = MessagesStream::new(meta, reasoning);
        let response = stream_generation(guard, request, format, rec.clone()).await?;
        return Ok(Reply::Streaming(response));
    }
    let Generated { text, calls, summary } = generate_all(guard, request, rec).await?;
    let answer = stream::whole(&meta, reasoning, &text, &calls, &summary);
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}

/// Bodies larger than this are parsed and converted on a blocking thread: a Messages
/// body's JSON tree is many times its size (about 27× measured), and parsing one of
/// megabytes on an async thread delays every other request on it (`/healthz` included).
const PARSE_OFF_THREAD_BYTES: usize = 64 << 10;

/// `parse` run on the request body: inline for a small one, on a blocking thread for a
/// larger one.
async fn parsed<T, F>(ctx: &Ctx, parse: F) -> Result<T, ApiError>
where
    F: FnOnce(&bytes::Bytes) -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    let body = ctx.body.clone();
    if body.len() <= PARSE_OFF_THREAD_BYTES {
        return parse(&body);
    }
    tokio::task::spawn_blocking(move || parse(&body)).await.map_err(|e| {
        ApiError::new(RuntimeCode::RuntimeError, format!("parsing the request body failed: {e}"))
    })?
}

/// `POST /v1/messages/count_tokens`.
async fn count_tokens(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::CountTokens);
    let reply = count(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn count(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    crate::openai::limits::check_messages(ctx, rec)?;
    let mut prompted = parsed(ctx, |body| {
        convert::check_tags(&parse_json(body, false)?)?;
        let body: Conversation = parse_json(body, false)?;
        convert::prompted(body)
    })
    .await?;
    let model = rec.model(prompted.model.take())?;
    let images = std::mem::take(&mut prompted.images);
    let kind = check_images(ctx, &model, &images)?;
    let request = prompted.into_request();
    let guard = ctx.state.manager.admit(&model, Work::generation(&request)).await?;
    let input_tokens = if guard.forwards() {
        let forwarded = forward::Forwarded { request, images, kind };
        count::count(ctx, &guard, &model, &forwarded).await?
    } else {
        guard.count_tokens(request).await.map_err(manager_error)?
    };
    Ok(Reply::Done(json_response(StatusCode::OK, &TokenCount { input_tokens })))
}

/// `error` as the client's, an engine's `unsupported` as 501 `not_implemented`.
fn manager_error(error: ManagerError) -> ApiError {
    match error {
        ManagerError::Runtime(hangar_runtime::engine::RuntimeError::Unsupported { message }) => {
            ApiError::new(RuntimeCode::NotImplemented, message)
        }
        other => other.into(),
    }
}

/// The model's engine, once its images are checked: they go only to an engine that takes
/// OpenAI requests (the typed path carries text), and only where the model takes images:
/// a `llama_server` model with a projector, and `vllm_serve` and `openai_remote` models,
/// whose engine knows its model's inputs and answers for them (their chat route gets images
/// as sent, too). An image by URL needs the model's `allow_remote_media`, since the engine
/// would fetch it from this machine.
///
/// # Errors
/// 400 `invalid_request` naming the first image refused.
fn check_images(
    ctx: &Ctx,
    model: &str,
    images: &[convert::Image],
) -> Result<BackendKind, ApiError> {
    let manager = &ctx.state.manager;
    // An unknown model is left to admission, which answers 404.
    let Some(config) = manager.model_config(model) else { return Ok(BackendKind::Stub) };
    let kind = config.backend;
    let Some(first) = images.first() else { return Ok(kind) };
    let takes_images = manager.forwards(model)
        && (matches!(kind, BackendKind::VllmServe | BackendKind::OpenaiRemote)
            || manager
                .model(model)
                .is_ok_and(|m| m.capabilities.modalities.contains(&Modality::Image)));
    if !takes_images {
        return Err(ApiError::bad_request(format!(
            "{}: model `{model}` takes no images (its capabilities.modalities are text only)",
            first.at
        )));
    }
    if let Some(remote) = images.iter().find(|i| i.remote())
        && !config.remote_media_allowed()
    {
        return Err(ApiError::bad_request(format!(
            "{}: images by URL are refused unless the model's allow_remote_media is on (the \
             engine would fetch them from this machine); send the bytes as base64",
            remote.at
        )));
    }
    Ok(kind)
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The `error` object of Anthropic's envelope for `error`.
pub(crate) fn error_detail(error: &ApiError) -> ErrorDetail {
    ErrorDetail {
        kind: error_type(error.status()).to_owned(),
        message: error.message.clone(),
        code: error.code.as_str().to_owned(),
    }
}

/// `error` in Anthropic's envelope, with Hangar's status (and `Retry-After`).
pub(crate) fn error_response(error: ApiError) -> Response {
    let body = ErrorEnvelope { kind: ErrorType::Value, error: error_detail(&error) };
    error.into_response_with(&body)
}

/// Whether `path` is one of this API's, whose refusals answer in its envelope.
pub(crate) fn owns(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// The errors of the two routes: those of every inference route, and `not_implemented`.
static ERRORS: LazyLock<Vec<ErrorCode>> = LazyLock::new(|| {
    let mut errors = crate::routes::INFERENCE.to_vec();
    errors.push(ErrorCode::Runtime(RuntimeCode::NotImplemented));
    errors
});

fn messages_route(ctx: Ctx) -> HandlerFuture {
    Box::pin(async move { messages(ctx).await.unwrap_or_else(error_response) })
}

fn count_tokens_route(ctx: Ctx) -> HandlerFuture {
    Box::pin(async move { count_tokens(ctx).await.unwrap_or_else(error_response) })
}

/// The two routes.
pub(crate) fn routes() -> Vec<Route> {
    let post = http::Method::POST;
    vec![
        Route::new(post.clone(), "/v1/messages", Group::Anthropic, messages_route)
            .doc(
                "Message (Anthropic Messages API)",
                "Generates the next assistant turn of `messages` as content blocks (`text`, `thinking`, `tool_use`); `max_tokens` is required. `thinking: {\"type\": \"enabled\"}` must be allowed by the model's capabilities.thinking_modes (400 thinking_unsupported); a reasoning model's thinking comes back as `thinking` blocks with a `signature` (accepted back, and left out of the prompt). Streams the Messages API's events with `stream: true`. Takes `x-api-key` as well as `Authorization: Bearer`, and any `anthropic-version`. Errors answer in Anthropic's envelope with Hangar's `code` inside. Models of engines that take OpenAI requests (llama_server, vllm_serve, openai_remote) get the request as a chat completion and their answer as blocks (`reasoning_content` as thinking); `stop_sequence` is named when the engine reports it (llama-server and vLLM do). `image` blocks (base64, or by URL where the model's allow_remote_media is on) go as `image_url` parts to those engines only: a llama_server model with a projector, vllm_serve and openai_remote models; elsewhere 400 invalid_request.",
            )
            .body::<MessagesRequest>(false)
            .example(|m| {
                Some(json!({
                    "model": m.llm.as_ref()?,
                    "max_tokens": 16,
                    "messages": [{ "role": "user", "content": "Say hello." }]
                }))
            })
            .ok_or_events::<types::MessageOut, StreamEvent>()
            .errors(&ERRORS),
        Route::new(post, "/v1/messages/count_tokens", Group::Anthropic, count_tokens_route)
            .doc(
                "Count tokens (Anthropic Messages API)",
                "The prompt tokens of a `/v1/messages` request, rendered and tokenized by the model's own template and tokenizer without generating: the `input_tokens` plus `cache_read_input_tokens` of the same request's usage. Engines that take OpenAI requests count the chat completion a generation would send: llama_server with its /apply-template and /tokenize, vllm_serve with its /tokenize, openai_remote with the remote's own /v1/messages/count_tokens. The Python bridge (CTranslate2, ExLlamaV3, vLLM) counts with the engine's own template and tokenizer too. Where the engine cannot count without generating: 501 not_implemented (a remote without the route, images on llama_server).",
            )
            .body::<Conversation>(false)
            .example(|m| {
                Some(json!({
                    "model": m.llm.as_ref()?,
                    "messages": [{ "role": "user", "content": "Say hello." }]
                }))
            })
            .ok::<TokenCount>()
            .errors(&ERRORS),
    ]
}
