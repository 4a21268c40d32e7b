//! Bodies: the response body type, JSON in and out, and server-sent events.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
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

/// Parses a JSON request body. An empty body (no bytes at all) parses as `{}` when
/// `empty_is_object`.
///
/// A number with a zero fraction (`5.0`) is an integer in JSON Schema, so it is read as
/// one wherever the body's type wants an integer.
///
/// # Errors
/// 422 `invalid_request_body` with the parser's message, line and column.
pub(crate) fn parse_json<T: DeserializeOwned>(
    body: &Bytes,
    empty_is_object: bool,
) -> Result<T, ApiError> {
    let body: &[u8] = if empty_is_object && body.is_empty() { b"{}" } else { body };
    let invalid = |e: serde_json::Error| ApiError::body(format!("invalid JSON body: {e}"));
    // Every body is an object; serde would also read a struct from an array.
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            let what = serde_json::from_slice::<Value>(body).map_err(invalid)?;
            return Err(ApiError::body(format!(
                "the body must be a JSON object, got {}",
                hangar_config::json_kind(&what)
            )));
        }
        None => return Err(ApiError::body("the body must be a JSON object; it is blank")),
    }
    match serde_json::from_slice(body) {
        Ok(parsed) => Ok(parsed),
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            let mut value: Value = serde_json::from_slice(body).map_err(invalid)?;
            if integral_floats_to_integers(&mut value) {
                serde_json::from_value(value).map_err(invalid)
            } else {
                Err(invalid(e))
            }
        }
        Err(e) => Err(invalid(e)),
    }
}

/// Rewrites every number with a zero fraction that fits an integer as that integer (JSON
/// Schema's integers include `5.0`); whether anything changed.
pub(crate) fn integral_floats_to_integers(value: &mut Value) -> bool {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            let integer = if f.fract() != 0.0 || !f.is_finite() {
                None
            } else if f >= 0.0 && f <= u64::MAX as f64 {
                Some(serde_json::Number::from(f as u64))
            } else if f < 0.0 && f >= i64::MIN as f64 {
                Some(serde_json::Number::from(f as i64))
            } else {
                None
            };
            integer.map(|i| *n = i).is_some()
        }
        Value::Array(items) => {
            items.iter_mut().fold(false, |c, v| integral_floats_to_integers(v) | c)
        }
        Value::Object(map) => {
            map.values_mut().fold(false, |c, v| integral_floats_to_integers(v) | c)
        }
        _ => false,
    }
}

/// The bytes of request bodies held at once, all requests together, under
/// `max_request_bodies_bytes`: each body holds its share ([`Held`]) from its first byte
/// until its request's handler returns.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    held: std::sync::atomic::AtomicUsize,
    max: usize,
}

impl BodyBudget {
    /// A budget of `max` bytes.
    pub(crate) fn new(max: usize) -> Self {
        Self { held: std::sync::atomic::AtomicUsize::new(0), max }
    }

    /// The bound, in bytes.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One body's share of the [`BodyBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    budget: std::sync::Arc<BodyBudget>,
    bytes: usize,
}

impl Held {
    /// Nothing held yet.
    pub(crate) fn none(budget: &std::sync::Arc<BodyBudget>) -> Self {
        Self { budget: std::sync::Arc::clone(budget), bytes: 0 }
    }

    /// Holds `bytes` in all; `false` (and nothing more held) when that would pass the
    /// budget.
    pub(crate) fn grow_to(&mut self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering;
        let Some(more) = bytes.checked_sub(self.bytes).filter(|&m| m > 0) else { return true };
        let max = self.budget.max;
        let grown = self.budget.held.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
            held.checked_add(more).filter(|&total| total <= max)
        });
        if grown.is_ok() {
            self.bytes = bytes;
        }
        grown.is_ok()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A streaming response body fed by a channel of chunks.
pub(crate) struct ChannelBody(mpsc::Receiver<Bytes>);

impl ChannelBody {
    /// A body of the chunks `rx` receives, ending when its senders are gone.
    pub(crate) fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self(rx)
    }
}

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
/// away, the body is dropped and sends fail: that is the cancellation signal. A client that
/// stays connected but stops reading fails sends too, after `write_timeout`.
pub(crate) fn sse_response(write_timeout: Duration) -> (Response, SseSender) {
    let (sender, rx) = SseSender::channel(64, write_timeout);
    let mut resp = http::Response::new(ChannelBody(rx).boxed());
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (resp, sender)
}

/// The sending side of a streamed body. A send fails once the client is gone, or when the
/// client has not taken the queued chunks for the write timeout (a reader that stopped
/// reading holds its generation's slot otherwise, for ever).
#[derive(Debug, Clone)]
pub(crate) struct SseSender {
    tx: mpsc::Sender<Bytes>,
    write_timeout: Duration,
}

/// Why a chunk was not sent: the client went away, or stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// The client closed the connection.
    Closed,
    /// The client kept the connection open but read nothing for the write timeout.
    Stalled,
}

impl SseSender {
    /// A sender and the receiver a [`ChannelBody`] reads, `capacity` chunks apart.
    pub(crate) fn channel(
        capacity: usize,
        write_timeout: Duration,
    ) -> (Self, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self { tx, write_timeout }, rx)
    }

    /// Queues `chunk`, waiting at most the write timeout for room.
    ///
    /// # Errors
    /// [`Gone`] when the client went away or stopped reading.
    pub(crate) async fn send(&self, chunk: Bytes) -> Result<(), Gone> {
        match self.tx.send_timeout(chunk, self.write_timeout).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Gone::Closed),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                tracing::debug!(timeout = ?self.write_timeout, "stream reader stalled: ending the stream");
                Err(Gone::Stalled)
            }
        }
    }

    /// Resolves when the client has gone away.
    pub(crate) async fn closed(&self) {
        self.tx.closed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_floats_read_as_integers_and_fractions_do_not() {
        #[derive(serde::Deserialize)]
        struct Body {
            n: u32,
        }
        let ok: Body = parse_json(&Bytes::from_static(br#"{"n": 5.0}"#), false).unwrap();
        assert_eq!(ok.n, 5);
        let err = parse_json::<Body>(&Bytes::from_static(br#"{"n": 5.5}"#), false).err().unwrap();
        assert!(err.message.contains("line 1 column"), "the original error: {}", err.message);
        let too_big = parse_json::<Body>(&Bytes::from_static(br#"{"n": 5e12}"#), false);
        assert!(too_big.is_err());
    }

    #[test]
    fn bodies_hold_their_share_until_dropped_and_the_budget_is_never_passed() {
        let budget = std::sync::Arc::new(BodyBudget::new(100));
        let mut a = Held::none(&budget);
        let mut b = Held::none(&budget);
        assert!(a.grow_to(60));
        assert!(a.grow_to(40), "shrinking holds nothing more");
        assert_eq!(budget.held(), 60);
        assert!(!b.grow_to(41), "60 + 41 passes 100");
        assert_eq!(budget.held(), 60, "a refused growth holds nothing");
        assert!(b.grow_to(40));
        assert_eq!(budget.held(), 100);
        drop(a);
        assert_eq!(budget.held(), 40);
        assert!(b.grow_to(100));
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn bodies_are_objects() {
        #[derive(Debug, serde::Deserialize)]
        struct Body {
            #[allow(dead_code)]
            n: Option<u32>,
        }
        let array = parse_json::<Body>(&Bytes::from_static(b" []"), false).unwrap_err();
        assert!(array.message.contains("must be a JSON object, got an array"), "{}", array.message);
        assert!(parse_json::<Body>(&Bytes::from_static(b""), true).is_ok());
        assert!(parse_json::<Body>(&Bytes::from_static(b""), false).is_err());
    }
}
