//! [`Upstream`]: the forwarding HTTP client of one OpenAI-compatible server (a child or a
//! remote): the body goes up as sent (rewritten only for `model` and `thinking`), the answer
//! comes back chunk by chunk; a dropped receiver cancels the upstream request.
//!
//! The client is hyper's own pooled client (`hyper-util`), not a convenience wrapper: on a
//! forwarded request a wrapper's URL parsing, redirect and retry layers cost more than the
//! HTTP exchange itself. Every route's URI is parsed once. `https://` remotes go through
//! rustls with the system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` replace them).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{ForwardRequest, ForwardResponse, ForwardRoute, RuntimeError, ThinkingMode};
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

/// Chunks buffered between the upstream connection and the client.
const CHUNKS: usize = 32;
/// Longest error body read from upstream.
const ERROR_BODY: usize = 16 * 1024;
type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One upstream server.
#[derive(Clone)]
pub(crate) struct Upstream {
    client: HttpClient,
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
        let https = match routes.chat.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("`{base}` is not an http:// or https:// URL")),
        };
        let auth = match api_key {
            Some(key) => {
                let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| "the API key holds characters a header cannot carry")?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(https))
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self { client, base, routes, auth, rename })
    }

    /// `GET url` with the key; the status, or why there was none.
    pub(crate) async fn probe(&self, url: &str, timeout: Duration) -> Result<u16, String> {
        let uri = url.parse::<Uri>().map_err(|e| format!("`{url}` is not a valid URL: {e}"))?;
        let request = self.request(Method::GET, uri, Bytes::new());
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            Ok(Err(e)) => Err(error_chain(&e)),
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
        let uri = self.routes.get(request.route).clone();
        let body = rewrite(request.body, self.rename.as_deref(), request.thinking);
        let upstream = self.request(Method::POST, uri, body);
        let response = match self.client.request(upstream).await {
            Ok(response) => response,
            Err(e) => return Err(explain.explain(error_chain(&e)).await),
        };
        let status = response.status().as_u16();
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut body = response.into_body();
        if !(200..300).contains(&status) {
            let mut text = Vec::new();
            while let Some(Ok(chunk)) = next_chunk(&mut body).await {
                text.extend_from_slice(&chunk);
                if text.len() > ERROR_BODY {
                    break;
                }
            }
            return Err(upstream_error(status, &text));
        }
        let streamed = content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream"));
        if !streamed {
            // A JSON answer is read here, whole: no task and no channel hop per chunk.
            let (tx, rx) = mpsc::channel(1);
            let whole = match body.collect().await {
                Ok(collected) => Ok(collected.to_bytes()),
                Err(e) => Err(explain.explain(error_chain(&e)).await),
            };
            let _ = tx.try_send(whole);
            return Ok(ForwardResponse { status, content_type, body: rx });
        }
        let (tx, rx) = mpsc::channel(CHUNKS);
        tokio::spawn(async move {
            loop {
                let chunk = tokio::select! {
                    chunk = next_chunk(&mut body) => chunk,
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
        });
        Ok(ForwardResponse { status, content_type, body: rx })
    }

    /// A request to `uri` with the key and, when there is one, the JSON body.
    fn request(&self, method: Method, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
        let post = method == Method::POST;
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        if post {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        request
    }
}

/// The next data chunk of `body` (trailers and other frames skipped); `None` at its end.
async fn next_chunk(body: &mut Incoming) -> Option<Result<Bytes, hyper::Error>> {
    loop {
        match body.frame().await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

/// The TLS settings of an upstream: for `https://`, the system's root certificates (or those
/// of `SSL_CERT_FILE` / `SSL_CERT_DIR`), read once, on the first `https://` upstream; `http://`
/// upstreams (every child) get settings without roots and never read the system's.
fn tls_config(https: bool) -> rustls::ClientConfig {
    static SYSTEM: OnceLock<rustls::ClientConfig> = OnceLock::new();
    static NONE: OnceLock<rustls::ClientConfig> = OnceLock::new();
    let config = |roots: rustls::RootCertStore| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth())
            .expect("ring supports the default TLS versions")
    };
    if !https {
        return NONE.get_or_init(|| config(rustls::RootCertStore::empty())).clone();
    }
    SYSTEM
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!("cannot read a root certificate: {error}");
            }
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(ignored, "no root certificates found: https:// upstreams will fail");
            }
            config(roots)
        })
        .clone()
}

/// The URIs of the forwarded routes below an OpenAI base URL (which ends in `/v1`).
#[derive(Clone)]
struct Routes {
    chat: Uri,
    completions: Uri,
    embeddings: Uri,
    rerank: Uri,
    responses: Uri,
}

impl Routes {
    fn new(base: &str) -> Result<Self, String> {
        let parse = |path: &str| {
            let url = format!("{base}{path}");
            url.parse::<Uri>().map_err(|e| format!("`{url}` is not a valid URL: {e}"))
        };
        Ok(Self {
            chat: parse("/chat/completions")?,
            completions: parse("/completions")?,
            embeddings: parse("/embeddings")?,
            rerank: parse("/rerank")?,
            responses: parse("/responses")?,
        })
    }

    fn get(&self, route: ForwardRoute) -> &Uri {
        match route {
            ForwardRoute::ChatCompletions => &self.chat,
            ForwardRoute::Completions => &self.completions,
            ForwardRoute::Embeddings => &self.embeddings,
            ForwardRoute::Rerank => &self.rerank,
            ForwardRoute::Responses => &self.responses,
        }
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
