//! Requests for models whose engine serves the OpenAI API itself (`llama_server`,
//! `vllm_serve`, `openai_remote`): checked against Hangar's rules (`forward_rules.rs`),
//! admitted like every request, then passed through as sent. Server-sent events go back chunk by chunk; a JSON answer is read whole first, so
//! an engine that dies mid-answer is reported with a proper status.

use bytes::Bytes;
use hangar_runtime::engine::{ForwardRequest, ForwardRoute, RuntimeError, ThinkingMode};
use hangar_runtime::{ManagerError, RequestGuard, Work};
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::stream::{data_event, done_event};
use super::{Recorder, Reply};
use crate::body::{ChannelBody, Response, SseSender};
use crate::error::ApiError;
use crate::router::Ctx;

/// The few fields Hangar reads of a forwarded body; everything else is the engine's.
#[derive(Deserialize)]
struct Peek {
    model: Option<String>,
    thinking: Option<ThinkingMode>,
    messages: Option<Vec<PeekMessage>>,
}

#[derive(Deserialize)]
struct PeekMessage {
    role: Option<String>,
}

/// Answers the request by forwarding when its model's engine forwards; `None` leaves it to
/// the typed handler (other engines, and bodies Hangar cannot read, which the typed handler
/// refuses with its precise error).
pub(crate) async fn forwarded(
    ctx: &Ctx,
    rec: &mut Recorder,
    route: ForwardRoute,
) -> Option<Result<Reply, ApiError>> {
    let peek: Peek = serde_json::from_slice(&ctx.body).ok()?;
    let model = peek.model.clone()?;
    if !ctx.state.manager.forwards(&model) {
        return None;
    }
    Some(forward(ctx, rec, route, model, peek).await)
}

async fn forward(
    ctx: &Ctx,
    rec: &mut Recorder,
    route: ForwardRoute,
    model: String,
    peek: Peek,
) -> Result<Reply, ApiError> {
    let model = rec.model(Some(model))?;
    let config = ctx.state.manager.model_config(&model);
    super::forward_rules::check(&ctx.body, config.is_some_and(|m| m.remote_media_allowed()))?;
    let thinking = peek.thinking.unwrap_or_default();
    let work = match route {
        ForwardRoute::Embeddings => Work::Embed,
        ForwardRoute::Rerank => Work::Rerank,
        _ => {
            let messages = peek.messages.unwrap_or_default();
            let users = messages.iter().filter(|m| m.role.as_deref() == Some("user")).count();
            Work::Generate { thinking, user_turns: users.max(1) }
        }
    };
    let guard = ctx.state.manager.admit(&model, work).await?;
    let max_answer_bytes = ctx.state.options.limits.max_answer_bytes.get();
    let request = ForwardRequest { route, body: ctx.body.clone(), thinking, max_answer_bytes };
    let answer = guard.forward(request).await?;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let content_type = answer.content_type.unwrap_or_else(|| "application/json".to_owned());
    let content_type = HeaderValue::from_str(&content_type)
        .unwrap_or(HeaderValue::from_static("application/json"));
    let body = answer.body;
    if !content_type.as_bytes().starts_with(b"text/event-stream") {
        let whole = read_whole(&guard, body).await?;
        let mut response = http::Response::new(Full::new(Bytes::from(whole)).boxed());
        *response.status_mut() = status;
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
        return Ok(Reply::Done(response));
    }
    let (tx, rx) = SseSender::channel(32, ctx.state.options.http.stream_write_timeout);
    let mut response: Response = http::Response::new(ChannelBody::new(rx).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let rec = rec.clone();
    tokio::spawn(async move {
        let outcome = pump(&guard, body, &tx).await;
        rec.record(outcome);
        drop(guard);
    });
    Ok(Reply::Streaming(response))
}

/// Copies the engine's events to the client until either side ends; the outcome's metrics
/// label. A failure mid-stream becomes an error event and `[DONE]`.
async fn pump(
    guard: &RequestGuard,
    mut body: mpsc::Receiver<Result<Bytes, RuntimeError>>,
    tx: &SseSender,
) -> &'static str {
    let aborted = guard.aborted();
    tokio::pin!(aborted);
    loop {
        tokio::select! {
            // An operator's abort ends the answer with an error event, as a failure does.
            error = &mut aborted => {
                let error = ApiError::from(error);
                let _ = tx.send(data_event(&error.to_body())).await;
                let _ = tx.send(done_event()).await;
                return error.code.as_str();
            }
            chunk = body.recv() => match chunk {
                Some(Ok(bytes)) => {
                    if tx.send(bytes).await.is_err() {
                        return "cancelled";
                    }
                }
                Some(Err(e)) => {
                    let error = failed(guard, e).await;
                    let _ = tx.send(data_event(&error.to_body())).await;
                    let _ = tx.send(done_event()).await;
                    return error.code.as_str();
                }
                None => return "ok",
            },
            // The client went away: returning drops `body`, which cancels upstream.
            () = tx.closed() => return "cancelled",
        }
    }
}

/// A forwarded answer read whole, unless the engine fails or an operator aborts first.
///
/// # Errors
/// The engine's failure (see [`failed`]) or the abort.
pub(crate) async fn read_whole(
    guard: &RequestGuard,
    mut body: mpsc::Receiver<Result<Bytes, RuntimeError>>,
) -> Result<Vec<u8>, ApiError> {
    let mut whole = Vec::new();
    let aborted = guard.aborted();
    tokio::pin!(aborted);
    loop {
        let chunk = tokio::select! {
            chunk = body.recv() => chunk,
            error = &mut aborted => return Err(error.into()),
        };
        match chunk {
            Some(Ok(bytes)) => whole.extend_from_slice(&bytes),
            Some(Err(e)) => return Err(failed(guard, e).await),
            None => return Ok(whole),
        }
    }
}

/// The API error of a failure while reading the answer; a crash marks the model failed.
pub(crate) async fn failed(guard: &RequestGuard, error: RuntimeError) -> ApiError {
    guard.report(&error).await;
    ApiError::from(ManagerError::Runtime(error))
}
