//! Running generations: to the end ([`generate_all`]) or as a server-sent event stream
//! ([`stream_generation`]) written by a per-API [`StreamFormat`].

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hangar_runtime::RequestGuard;
use hangar_runtime::engine::{GenerateEvent, GenerateRequest, GenerateSummary, ToolCall};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::Recorder;
use crate::body::{Response, SseSender, sse_response};
use crate::error::{ApiError, RuntimeCode};

/// A finished generation: its text, tool calls and summary.
pub(crate) struct Generated {
    pub(crate) text: String,
    pub(crate) calls: Vec<ToolCall>,
    pub(crate) summary: GenerateSummary,
}

/// Runs a generation to its end.
///
/// # Errors
/// The generation's error.
pub(crate) async fn generate_all(
    guard: RequestGuard,
    request: GenerateRequest,
    rec: &Recorder,
) -> Result<Generated, ApiError> {
    let (tx, mut rx) = mpsc::channel(64);
    let start = Instant::now();
    let collect = async move {
        let (mut text, mut calls, mut first) = (String::new(), Vec::new(), None);
        while let Some(event) = rx.recv().await {
            first.get_or_insert_with(Instant::now);
            match event {
                GenerateEvent::Text(piece) => text.push_str(&piece),
                GenerateEvent::ToolCall(call) => calls.push(call),
            }
        }
        (text, calls, first)
    };
    let (result, (text, calls, first)) = tokio::join!(guard.generate(request, tx), collect);
    let summary = result?;
    rec.generation(&summary, start, first);
    Ok(Generated { text, calls, summary })
}

/// How a stream's events are written, per API.
pub(crate) trait StreamFormat: Send + 'static {
    /// Events sent before generation starts.
    fn start(&mut self) -> Vec<Bytes>;
    /// Events for one piece of generated text.
    fn delta(&mut self, text: &str) -> Vec<Bytes>;
    /// Events for one complete tool call (only requests with tools get them).
    fn tool_call(&mut self, call: ToolCall) -> Vec<Bytes>;
    /// Events after the generation finished.
    fn finish(&mut self, summary: &GenerateSummary) -> Vec<Bytes>;
    /// Events after the generation failed.
    fn fail(&mut self, error: &ApiError) -> Vec<Bytes>;
}

/// One unnamed SSE event carrying `data` as JSON.
pub(crate) fn data_event<T: Serialize>(data: &T) -> Bytes {
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("data: {json}\n\n"))
}

/// One named SSE event (`event: <name>`) carrying `data` as JSON.
pub(crate) fn named_event<T: Serialize>(name: &str, data: &T) -> Bytes {
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// The `data: [DONE]` event that ends OpenAI chunk streams.
pub(crate) fn done_event() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// How a streamed generation opened: its first event, its end before any event, or the
/// client going away first.
enum Opening {
    Event(GenerateEvent),
    /// The event channel closed: the generation has ended (its result is still to be read).
    Closed,
    Ended(Result<GenerateSummary, ApiError>),
    ClientGone,
}

/// Starts a streamed generation in a spawned task and answers once it has produced its first
/// event: then with 200 and an SSE stream that the task feeds. A generation that fails before
/// producing anything (a prompt longer than the context, a schema the engine cannot use) is
/// answered like a non-streamed one, with its status and a JSON error. The task owns the
/// request's guard: when the client disconnects, forwarding stops and drops the
/// generation's receiver, the backend cancels, and the guard (the slot) is released.
///
/// # Errors
/// The generation's error when it failed before its first event.
pub(crate) async fn stream_generation(
    guard: RequestGuard,
    request: GenerateRequest,
    mut format: impl StreamFormat,
    rec: Recorder,
) -> Result<Response, ApiError> {
    let (response, sse) = sse_response(rec.state.options.http.stream_write_timeout);
    let (mut ready, opened) = oneshot::channel::<Result<(), ApiError>>();
    tokio::spawn(async move {
        let guard = Arc::new(guard);
        let (tx, mut rx) = mpsc::channel(64);
        let start = Instant::now();
        let generation = {
            let guard = Arc::clone(&guard);
            async move { guard.generate(request, tx).await.map_err(ApiError::from) }
        };
        tokio::pin!(generation);
        let opening = tokio::select! {
            event = rx.recv() => event.map_or(Opening::Closed, Opening::Event),
            result = &mut generation => Opening::Ended(result),
            () = ready.closed() => Opening::ClientGone,
        };
        let (first_event, ended) = match opening {
            Opening::Event(event) => (Some(event), None),
            Opening::Closed => (None, Some((&mut generation).await)),
            Opening::Ended(result) => (None, Some(result)),
            Opening::ClientGone => {
                drop(rx);
                let result = (&mut generation).await;
                rec.record(result.as_ref().err().map_or("ok", |e| e.code.as_str()));
                return;
            }
        };
        if let Some(Err(e)) = ended.as_ref()
            && rx.is_empty()
        {
            // Nothing was generated: the error is the answer (the handler records it).
            if let Err(Err(e)) = ready.send(Err(e.clone())) {
                rec.record(e.code.as_str());
            }
            return;
        }
        let mut connected = ready.send(Ok(())).is_ok() && send_all(&sse, format.start()).await;
        let mut first = None;
        if let Some(event) = first_event {
            first = Some(Instant::now());
            connected = connected && send_all(&sse, event_bytes(&mut format, event)).await;
        }
        let result = match ended {
            Some(result) => {
                connected = forward(rx, &sse, &mut format, connected, &mut first).await;
                result
            }
            None => {
                let forward = forward(rx, &sse, &mut format, connected, &mut first);
                let (result, still) = tokio::join!(&mut generation, forward);
                connected = still;
                result
            }
        };
        if let Ok(summary) = &result {
            rec.generation(summary, start, first);
        }
        rec.record(result.as_ref().err().map_or("ok", |e| e.code.as_str()));
        drop(guard);
        if !connected {
            tracing::debug!(model = %rec.model_label(), "stream client went away; generation cancelled");
            return;
        }
        let tail = match &result {
            Ok(summary) => format.finish(summary),
            Err(e) => format.fail(e),
        };
        send_all(&sse, tail).await;
    });
    match opened.await {
        Ok(Ok(())) => Ok(response),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            Err(ApiError::new(RuntimeCode::RuntimeError, "the generation ended without an answer"))
        }
    }
}

/// The stream events of one generation event.
fn event_bytes(format: &mut impl StreamFormat, event: GenerateEvent) -> Vec<Bytes> {
    match event {
        GenerateEvent::Text(text) => format.delta(&text),
        GenerateEvent::ToolCall(call) => format.tool_call(call),
    }
}

/// Forwards generated text to the client until the generation ends (`true`) or the client
/// goes away (`false`). Returning drops `rx`, which tells the backend to stop.
async fn forward(
    mut rx: mpsc::Receiver<GenerateEvent>,
    sse: &SseSender,
    format: &mut impl StreamFormat,
    connected: bool,
    first: &mut Option<Instant>,
) -> bool {
    if !connected {
        return false;
    }
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(event) => {
                    first.get_or_insert_with(Instant::now);
                    if !send_all(sse, event_bytes(format, event)).await {
                        return false;
                    }
                }
                None => return true,
            },
            () = sse.closed() => return false,
        }
    }
}

/// Sends events in order; `false` once the client is gone.
pub(crate) async fn send_all(sse: &SseSender, events: Vec<Bytes>) -> bool {
    for event in events {
        if sse.send(event).await.is_err() {
            return false;
        }
    }
    true
}
