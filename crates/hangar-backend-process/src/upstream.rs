//! [`Upstream`]: the forwarding HTTP client of one OpenAI-compatible server (a child or a
//! remote): the body goes up as sent (rewritten only for `model` and `thinking`), the answer
//! comes back chunk by chunk; a dropped receiver cancels the upstream request.

use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{ForwardRequest, ForwardResponse, ForwardRoute, RuntimeError, ThinkingMode};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

/// Chunks buffered between the upstream connection and the client.
const CHUNKS: usize = 32;
/// Longest error body read from upstream.
const ERROR_BODY: usize = 16 * 1024;

/// One upstream server.
#[derive(Clone)]
pub(crate) struct Upstream {
    client: reqwest::Client,
    /// `http://host:port/v1`.
    pub(crate) base: String,
    api_key: Option<String>,
    /// The model name upstream, when it differs from the client's.
    rename: Option<String>,
}

/// How a transport failure is explained: by the engine's death, when it died.
pub(crate) trait Explain: Send + Sync + 'static {
    /// The error for a request whose connection failed with `error`.
    fn explain(&self, error: String) -> impl std::future::Future<Output = RuntimeError> + Send;
}

impl Upstream {
    /// A client of `base` with a connection pool of its own.
    pub(crate) fn new(base: String, api_key: Option<String>, rename: Option<String>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        Self { client, base, api_key, rename }
    }

    /// `GET url` with the key; the status, or the transport error's text.
    pub(crate) async fn probe(&self, url: &str, timeout: Duration) -> Result<u16, String> {
        let mut request = self.client.get(url).timeout(timeout);
        if let Some(key) = &self.api_key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        match request.send().await {
            Ok(response) => Ok(response.status().as_u16()),
            Err(e) => Err(error_chain(&e)),
        }
    }

    /// Sends `request` upstream and returns the answer as it arrives.
    ///
    /// # Errors
    /// The engine's error answers (400/404/422 → [`RuntimeError::InvalidRequest`], 503 →
    /// [`RuntimeError::Unavailable`], others → [`RuntimeError::Upstream`]); transport
    /// failures as `explain` says.
    pub(crate) async fn forward(
        &self,
        request: ForwardRequest,
        explain: impl Explain + Clone,
    ) -> Result<ForwardResponse, RuntimeError> {
        let url = format!("{}{}", self.base, path(request.route));
        let body = rewrite(request.body, self.rename.as_deref(), request.thinking);
        let mut upstream =
            self.client.post(url).header(CONTENT_TYPE, "application/json").body(body);
        if let Some(key) = &self.api_key {
            upstream = upstream.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let mut response = match upstream.send().await {
            Ok(response) => response,
            Err(e) => return Err(explain.explain(error_chain(&e)).await),
        };
        let status = response.status().as_u16();
        if !response.status().is_success() {
            let mut body = Vec::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                body.extend_from_slice(&chunk);
                if body.len() > ERROR_BODY {
                    break;
                }
            }
            return Err(upstream_error(status, &body));
        }
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let streamed = content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream"));
        if !streamed {
            // A JSON answer is read here, whole: no task and no channel hop per chunk.
            let (tx, rx) = mpsc::channel(1);
            let body = match response.bytes().await {
                Ok(bytes) => Ok(bytes),
                Err(e) => Err(explain.explain(error_chain(&e)).await),
            };
            let _ = tx.try_send(body);
            return Ok(ForwardResponse { status, content_type, body: rx });
        }
        let (tx, rx) = mpsc::channel(CHUNKS);
        tokio::spawn(async move {
            loop {
                let chunk = tokio::select! {
                    chunk = response.chunk() => chunk,
                    // The client went away: dropping `response` closes the connection,
                    // which cancels the request upstream.
                    () = tx.closed() => return,
                };
                match chunk {
                    Ok(Some(bytes)) => {
                        if tx.send(Ok(bytes)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        let error = explain.explain(error_chain(&e)).await;
                        let _ = tx.send(Err(error)).await;
                        return;
                    }
                }
            }
        });
        Ok(ForwardResponse { status, content_type, body: rx })
    }
}

/// The route's path below an OpenAI base URL (which ends in `/v1`).
fn path(route: ForwardRoute) -> &'static str {
    match route {
        ForwardRoute::ChatCompletions => "/chat/completions",
        ForwardRoute::Completions => "/completions",
        ForwardRoute::Embeddings => "/embeddings",
        ForwardRoute::Rerank => "/rerank",
        ForwardRoute::Responses => "/responses",
    }
}

/// The body to send: unchanged unless the model is renamed upstream or the request sets a
/// thinking mode, which becomes `chat_template_kwargs.enable_thinking` (the switch of
/// llama-server's, vLLM's and SGLang's chat templates).
fn rewrite(body: Bytes, rename: Option<&str>, thinking: ThinkingMode) -> Bytes {
    if rename.is_none() && thinking == ThinkingMode::Default {
        return body;
    }
    let Ok(mut map) = serde_json::from_slice::<Map<String, Value>>(&body) else {
        return body;
    };
    if let Some(name) = rename {
        map.insert("model".to_owned(), Value::from(name));
    }
    if thinking != ThinkingMode::Default {
        map.remove("thinking");
        let kwargs = map.entry("chat_template_kwargs").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(kwargs) = kwargs {
            kwargs.insert(
                "enable_thinking".to_owned(),
                Value::from(thinking == ThinkingMode::Enabled),
            );
        }
    }
    serde_json::to_vec(&map).map(Bytes::from).unwrap_or_default()
}

/// The engine's error answer as a [`RuntimeError`], with the engine's own message.
pub(crate) fn upstream_error(status: u16, body: &[u8]) -> RuntimeError {
    let message = message_of(body);
    match status {
        400 | 404 | 413 | 422 => RuntimeError::InvalidRequest { message },
        503 => RuntimeError::Unavailable { message },
        _ => RuntimeError::Upstream { status, message },
    }
}

/// `error.message`, `message`, `error` (a string) or `detail` of a JSON error body, else the
/// body's text.
fn message_of(body: &[u8]) -> String {
    let text = || String::from_utf8_lossy(body).trim().to_owned();
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return text();
    };
    let candidates = [
        value.pointer("/error/message"),
        value.get("message"),
        value.get("error"),
        value.get("detail"),
    ];
    candidates.into_iter().flatten().find_map(Value::as_str).map_or_else(text, str::to_owned)
}

/// A reqwest error with its causes ("error sending request: connection refused").
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_pass_unchanged_without_rename_or_thinking() {
        let body = Bytes::from_static(br#"{"model":"m",  "x": 1}"#);
        assert_eq!(rewrite(body.clone(), None, ThinkingMode::Default), body);
    }

    #[test]
    fn thinking_becomes_chat_template_kwargs_and_rename_sets_the_model() {
        let body = Bytes::from_static(
            br#"{"model":"m","thinking":"disabled","chat_template_kwargs":{"a":1}}"#,
        );
        let out: Value =
            serde_json::from_slice(&rewrite(body, Some("remote"), ThinkingMode::Disabled)).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"model": "remote", "chat_template_kwargs": {"a": 1, "enable_thinking": false}})
        );
    }

    #[test]
    fn engine_errors_keep_their_message_and_map_by_status() {
        let vllm = br#"{"object":"error","message":"The model `x` does not exist.","code":404}"#;
        assert_eq!(
            upstream_error(404, vllm),
            RuntimeError::InvalidRequest { message: "The model `x` does not exist.".into() }
        );
        let llama =
            br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert_eq!(
            upstream_error(503, llama),
            RuntimeError::Unavailable { message: "Loading model".into() }
        );
        assert_eq!(
            upstream_error(500, b"boom"),
            RuntimeError::Upstream { status: 500, message: "boom".into() }
        );
    }
}
