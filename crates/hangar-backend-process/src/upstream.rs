//! [`Upstream`]: the forwarding HTTP client of one OpenAI-compatible server (a child or a
//! remote): the body goes up as sent (rewritten only for `model` and `thinking`), the answer
//! comes back chunk by chunk; a dropped receiver cancels the upstream request.
//!
//! The client is hyper's low-level HTTP/1.1 connection in a pool of our own ([`Pool`]: the
//! task that forwards a request drives its connection), not a convenience wrapper: on a
//! forwarded request a wrapper's URL parsing, redirect and retry layers, and a connection
//! task of its own, cost more than the HTTP exchange itself. Every route's URI is parsed
//! once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{ForwardRequest, ForwardResponse, ForwardRoute, RuntimeError, ThinkingMode};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::pool::{Answer, Pool};

/// Chunks buffered between the upstream connection and the client.
const CHUNKS: usize = 32;
/// Longest error body read from upstream.
const ERROR_BODY: usize = 16 * 1024;

/// One upstream server.
#[derive(Clone)]
pub(crate) struct Upstream {
    pool: Arc<Pool>,
    /// The `Host` header of every request.
    host: HeaderValue,
    /// `http://host:port/v1`.
    pub(crate) base: String,
    /// Each route's URI, parsed once.
    routes: Routes,
    /// `Bearer <key>`, marked sensitive.
    auth: Option<HeaderValue>,
    /// The model name upstream, when it differs from the client's.
    rename: Option<String>,
}

/// How a transport failure is explained: by the engine's death, when it died.
pub(crate) trait Explain: Send + Sync + 'static {
    /// The error for a request whose connection failed with `error`.
    fn explain(&self, error: String) -> impl std::future::Future<Output = RuntimeError> + Send;
}

impl Upstream {
    /// A client of `base` (an `http://` or `https://` URL ending before the route, e.g.
    /// `http://127.0.0.1:8081/v1`) with a connection pool of its own.
    ///
    /// # Errors
    /// Why `base` is not a usable URL, or `api_key` not a usable header value.
    pub(crate) fn new(
        base: String,
        api_key: Option<&str>,
        rename: Option<String>,
    ) -> Result<Self, String> {
        let routes = Routes::new(&base)?;
        if !matches!(routes.absolute.scheme_str(), Some("https" | "http")) {
            return Err(format!("`{base}` is not an http:// or https:// URL"));
        }
        let auth = match api_key {
            Some(key) => {
                let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| "the API key holds characters a header cannot carry")?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let authority =
            routes.absolute.authority().ok_or_else(|| format!("`{base}` names no host"))?;
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| format!("`{base}` names no usable host"))?;
        let target = Uri::builder()
            .scheme(routes.absolute.scheme_str().unwrap_or("http"))
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("`{base}` is not a valid URL: {e}"))?;
        let pool = Pool::new(target);
        Ok(Self { pool, host, base, routes, auth, rename })
    }

    /// The same server reached on the Unix socket `socket` (a child that listens there):
    /// the URL's authority is then only the `Host` header.
    pub(crate) fn on_socket(mut self, socket: PathBuf) -> Self {
        self.pool = Pool::unix(self.pool.target().clone(), socket);
        self
    }

    /// `GET url` with the key; the status, or why there was none.
    pub(crate) async fn probe(&self, url: &str, timeout: Duration) -> Result<u16, String> {
        self.call(Method::GET, url, Bytes::new(), timeout).await.map(|(status, _)| status)
    }

    /// `method url` with the key and `body` (JSON, when there is one); the status and the
    /// answer's body (up to [`ERROR_BODY`]), or why there was none within `timeout`.
    pub(crate) async fn call(
        &self,
        method: Method,
        url: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(u16, Bytes), String> {
        let uri = url.parse::<Uri>().map_err(|e| format!("`{url}` is not a valid URL: {e}"))?;
        let request = self.request(method, origin_form(&uri), body);
        let exchange = async {
            let mut answer = self.pool.send(request).await?;
            // Read the body to its end, so the connection can be used again.
            let body = read_whole(&mut answer, ERROR_BODY as u64).await?.unwrap_or_default();
            Ok::<_, crate::pool::Failure>((answer.head.status().as_u16(), body))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(error_chain(&*e)),
            Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f64())),
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
        let uri = self.routes.get(request.route);
        let route = request.route;
        let limit = request.max_answer_bytes;
        let body = rewrite(request.body, self.rename.as_deref(), request.thinking);
        let upstream = self.request(Method::POST, uri, body);
        let mut body = match self.pool.send(upstream).await {
            Ok(answer) => answer,
            Err(e) => return Err(explain.explain(error_chain(&*e)).await),
        };
        let status = body.head.status().as_u16();
        let content_type =
            body.head.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if !(200..300).contains(&status) {
            let mut text = Vec::new();
            while let Some(Ok(chunk)) = body.next_chunk().await {
                text.extend_from_slice(&chunk);
                if text.len() > ERROR_BODY {
                    break;
                }
            }
            if route.optional() && matches!(status, 404 | 405 | 501) {
                let path = self.routes.get(route);
                return Err(RuntimeError::Unsupported {
                    message: format!("the engine does not serve `POST {path}` ({status})"),
                });
            }
            return Err(upstream_error(status, &text));
        }
        let streamed = content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream"));
        if !streamed {
            // A JSON answer is read here, whole, up to `limit`: no task and no channel hop
            // per chunk. One announced as larger is not read at all.
            let announced = body.head.headers().get(CONTENT_LENGTH);
            let announced = announced.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if announced.is_some_and(|n| n > limit) {
                return Err(RuntimeError::AnswerTooLarge { limit });
            }
            let (tx, rx) = mpsc::channel(1);
            let whole = match read_whole(&mut body, limit).await {
                Ok(Some(bytes)) => Ok(bytes),
                Ok(None) => Err(RuntimeError::AnswerTooLarge { limit }),
                Err(e) => Err(explain.explain(error_chain(&e)).await),
            };
            let _ = tx.try_send(whole);
            return Ok(ForwardResponse { status, content_type, body: rx });
        }
        let (tx, rx) = mpsc::channel(CHUNKS);
        // This task drives the connection and its body, which wake each other.
        tokio::spawn(hangar_coalesce::Coalesced::new(async move {
            loop {
                let chunk = tokio::select! {
                    chunk = body.next_chunk() => chunk,
                    // The client went away: dropping `body` closes the connection, which
                    // cancels the request upstream.
                    () = tx.closed() => return,
                };
                match chunk {
                    Some(Ok(bytes)) => {
                        if tx.send(Ok(bytes)).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                    Some(Err(e)) => {
                        let error = explain.explain(error_chain(&e)).await;
                        let _ = tx.send(Err(error)).await;
                        return;
                    }
                }
            }
        }));
        Ok(ForwardResponse { status, content_type, body: rx })
    }

    /// A request to `uri` with the key and, when there is one, the JSON body.
    fn request(&self, method: Method, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
        let post = method == Method::POST;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        if post {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        request
    }
}

/// The whole body of `answer` (one chunk, the usual case for a JSON answer, is not copied);
/// `None` once it passes `limit` bytes (dropping the answer then closes its connection).
async fn read_whole(answer: &mut Answer, limit: u64) -> Result<Option<Bytes>, hyper::Error> {
    let over = |n: usize| u64::try_from(n).map_or(true, |n| n > limit);
    let Some(first) = answer.next_chunk().await.transpose()? else {
        return Ok(Some(Bytes::new()));
    };
    if over(first.len()) {
        return Ok(None);
    }
    let Some(second) = answer.next_chunk().await.transpose()? else {
        return Ok(Some(first));
    };
    let mut whole = Vec::with_capacity(first.len() + second.len());
    whole.extend_from_slice(&first);
    whole.extend_from_slice(&second);
    while !over(whole.len()) {
        match answer.next_chunk().await.transpose()? {
            Some(chunk) => whole.extend_from_slice(&chunk),
            None => return Ok(Some(Bytes::from(whole))),
        }
    }
    Ok(None)
}

/// `uri`'s path and query alone: what an HTTP/1.1 request line carries to an origin server.
fn origin_form(uri: &Uri) -> Uri {
    uri.path_and_query().map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()))
}

/// The URIs of the forwarded routes below an OpenAI base URL (which ends in `/v1`), in
/// origin form (path only: the request line of HTTP/1.1 to an origin server).
#[derive(Clone)]
struct Routes {
    /// The chat route's absolute URI: scheme and authority of the upstream.
    absolute: Uri,
    chat: Uri,
    completions: Uri,
    embeddings: Uri,
    rerank: Uri,
    responses: Uri,
    count_tokens: Uri,
    /// Below the server's root: the base without its `/v1`.
    tokenize: Uri,
    apply_template: Uri,
}

impl Routes {
    fn new(base: &str) -> Result<Self, String> {
        let below = |prefix: &str, path: &str| {
            let url = format!("{prefix}{path}");
            url.parse::<Uri>().map_err(|e| format!("`{url}` is not a valid URL: {e}"))
        };
        let parse = |path: &str| below(base, path).map(|uri| origin_form(&uri));
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let at_root = |path: &str| below(root, path).map(|uri| origin_form(&uri));
        Ok(Self {
            absolute: below(base, "/chat/completions")?,
            chat: parse("/chat/completions")?,
            completions: parse("/completions")?,
            embeddings: parse("/embeddings")?,
            rerank: parse("/rerank")?,
            responses: parse("/responses")?,
            count_tokens: parse("/messages/count_tokens")?,
            tokenize: at_root("/tokenize")?,
            apply_template: at_root("/apply-template")?,
        })
    }

    /// The route's URI in origin form.
    fn get(&self, route: ForwardRoute) -> Uri {
        match route {
            ForwardRoute::ChatCompletions => &self.chat,
            ForwardRoute::Completions => &self.completions,
            ForwardRoute::Embeddings => &self.embeddings,
            ForwardRoute::Rerank => &self.rerank,
            ForwardRoute::Responses => &self.responses,
            ForwardRoute::MessagesCountTokens => &self.count_tokens,
            ForwardRoute::Tokenize => &self.tokenize,
            ForwardRoute::ApplyTemplate => &self.apply_template,
        }
        .clone()
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

/// An error with its causes ("client error (Connect): tcp connect error: Connection refused").
fn error_chain(error: &dyn std::error::Error) -> String {
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
