//! Bodies: the response body type, JSON in and out, and server-sent events.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// The body of every response.
pub type ResponseBody = BoxBody<Bytes, Infallible>;
/// A response of the service.
pub type Response = http::Response<ResponseBody>;

/// A JSON response.
pub(crate) fn json_response<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Response {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a response body did not encode");
        b"{}".to_vec()
    });
    bytes_response(status, "application/json", Bytes::from(bytes))
}

/// A response of encoded bytes with a content type.
pub(crate) fn bytes_response(
    status: StatusCode,
    content_type: &'static str,
    bytes: Bytes,
) -> Response {
    let mut resp = http::Response::new(Full::new(bytes).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A text response with a content type.
pub(crate) fn text_response(
    status: StatusCode,
    content_type: &'static str,
    text: String,
) -> Response {
    bytes_response(status, content_type, Bytes::from(text))
}

/// An empty response.
pub(crate) fn empty_response(status: StatusCode) -> Response {
    let mut resp = http::Response::new(Full::new(Bytes::new()).boxed());
    *resp.status_mut() = status;
    resp
}

/// Parses a JSON request body. An empty body parses as `{}` when `empty_is_object`.
///
/// # Errors
/// 422 `invalid_request_body` with the parser's message, line and column.
pub(crate) fn parse_json<T: DeserializeOwned>(
    body: &Bytes,
    empty_is_object: bool,
) -> Result<T, ApiError> {
    let body: &[u8] =
        if empty_is_object && body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| ApiError::body(format!("invalid JSON body: {e}")))
}

/// A streaming response body fed by a channel of chunks.
pub(crate) struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A `text/event-stream` response and the sender that feeds it. When the client goes
/// away, the body is dropped and sends fail: that is the cancellation signal.
pub(crate) fn sse_response() -> (Response, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel(64);
    let mut resp = http::Response::new(ChannelBody(rx).boxed());
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (resp, tx)
}
