//! The gRPC listener's share of the connection limits ([`crate::listen`]), and its keys
//! checked before a byte of a call's message is read.
//!
//! Each call counts as a request in flight on its connection, so the cap never sheds a
//! connection with a call running and the idle deadline starts when its last call ends; a
//! request body has `connections.body_read_timeout_s` to arrive, else the call ends
//! DEADLINE_EXCEEDED with `hangar-error-code: body_timeout`.
//!
//! Before the generated handler decodes anything, the call's head passes the listeners'
//! gate ([`crate::listen::Gate`]) with the auth class of the HTTP route its RPC mirrors
//! ([`route_of`]): a call the keys refuse is answered UNAUTHENTICATED or PERMISSION_DENIED
//! at once, its message never read; a keyless call over `connections.max_keyless_streams`
//! is answered RESOURCE_EXHAUSTED; a connection past `connections.max_refused_calls` is
//! closed. The handlers check the keys again, for the caller they serve.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::Method;
use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError};

use crate::HangarService;
use crate::error::{ApiError, HttpCode};
use crate::listen::{BodyTimeout, ConnTag, Deadline, Gate, Tracked};

/// The HTTP route an RPC mirrors: its auth class is the RPC's.
pub(super) type Mirror = (Method, &'static str);

/// `ServerLive`.
pub(super) const SERVER_LIVE: Mirror = (Method::GET, "/v2/health/live");
/// `ServerReady`.
pub(super) const SERVER_READY: Mirror = (Method::GET, "/v2/health/ready");
/// `ModelReady`.
pub(super) const MODEL_READY: Mirror = (Method::GET, "/v2/models/m/ready");
/// `ServerMetadata`.
pub(super) const SERVER_METADATA: Mirror = (Method::GET, "/v2");
/// `ModelMetadata`.
pub(super) const MODEL_METADATA: Mirror = (Method::GET, "/v2/models/m");
/// `RepositoryIndex`.
pub(super) const REPOSITORY_INDEX: Mirror = (Method::POST, "/v2/repository/index");
/// `RepositoryModelLoad`.
pub(super) const REPOSITORY_LOAD: Mirror = (Method::POST, "/v2/repository/models/m/load");
/// `RepositoryModelUnload`.
pub(super) const REPOSITORY_UNLOAD: Mirror = (Method::POST, "/v2/repository/models/m/unload");
/// Every RPC Hangar does not serve (inference, shared memory, …), and unknown paths: the
/// inference class, so no key means no bytes read where inference keys are set.
const UNSERVED: Mirror = (Method::POST, "/v1/chat/completions");

/// The route the RPC at gRPC path `path` (`/inference.GRPCInferenceService/ServerLive`)
/// mirrors.
pub(super) fn route_of(path: &str) -> Mirror {
    let rpc = path.strip_prefix("/inference.GRPCInferenceService/").unwrap_or("");
    match rpc {
        "ServerLive" => SERVER_LIVE,
        "ServerReady" => SERVER_READY,
        "ModelReady" => MODEL_READY,
        "ServerMetadata" => SERVER_METADATA,
        "ModelMetadata" => MODEL_METADATA,
        "RepositoryIndex" => REPOSITORY_INDEX,
        "RepositoryModelLoad" => REPOSITORY_LOAD,
        "RepositoryModelUnload" => REPOSITORY_UNLOAD,
        _ => UNSERVED,
    }
}

/// A gRPC service under the connection limits and the gate. Its connections come from
/// [`crate::listen::Acceptor`], which tonic's `connect_info` hands to each request as a
/// [`ConnTag`].
#[derive(Clone)]
pub(super) struct Limited<S> {
    inner: S,
    http: HangarService,
}

impl<S> Limited<S> {
    pub(super) fn new(inner: S, http: HangarService) -> Self {
        Self { inner, http }
    }
}

impl<S> Service<http::Request<Body>> for Limited<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let tag = req.extensions().get::<ConnTag>().cloned();
        let mut in_flight = tag.as_ref().map(ConnTag::request);
        let (method, path) = route_of(req.uri().path());
        let options = self.http.options();
        let peer = tag.as_ref().map(|t| t.peer().ip());
        let auth = crate::router::auth_of(&method, path);
        let class = crate::auth::classify(options, auth, &method, path, peer, req.headers());
        let verdict = in_flight.as_mut().map_or(Gate::Pass, |f| f.gate(class));
        let refusal = match verdict {
            Gate::Pass => None,
            Gate::Refuse => {
                let refused =
                    crate::auth::Caller::of(options, auth, &method, path, peer, req.headers());
                Some(refused.err().unwrap_or_else(|| {
                    ApiError::new(HttpCode::Unauthorized, "the call needs a key")
                }))
            }
            Gate::TooManyKeyless => Some(crate::listen::too_many_keyless(&self.http)),
            // Shed: the connection closes at its next read or write.
            Gate::Close => Some(ApiError::new(
                HttpCode::Unauthorized,
                "too many refused calls on this connection (connections.max_refused_calls)",
            )),
        };
        if let Some(error) = refusal {
            // The message is never read: dropping the request resets its stream.
            drop(req);
            let response = super::status::status(error).into_http::<Body>();
            let response = response.map(|body| Body::new(Tracked::new(body, in_flight)));
            return Box::pin(async move { Ok(response) });
        }
        let timeout = options.connections.body_read_timeout;
        let read = tag.as_ref().map(ConnTag::body_bytes).unwrap_or_default();
        let req = req.map(|body| Body::new(Deadline::new(body, timeout, read).map_err(late)));
        let path = req.uri().path().to_owned();
        let call = self.inner.call(req);
        Box::pin(async move {
            let mut response = call.await?;
            decode_errors_as_callers(&mut response);
            unserved_says_so(&mut response, &path);
            Ok(response.map(|body| Body::new(Tracked::new(body, in_flight))))
        })
    }
}

/// tonic's decoder errors, as the caller's errors they are (their message kept): a message
/// that is not the RPC's protobuf is INVALID_ARGUMENT `invalid_request` (tonic: INTERNAL),
/// one over `max_request_body_bytes` RESOURCE_EXHAUSTED `payload_too_large`, as HTTP's 413
/// (tonic: OUT_OF_RANGE).
fn decode_errors_as_callers<B>(response: &mut http::Response<B>) {
    /// (tonic's status, the start of its percent-encoded message, ours, our error code)
    const DECODER: [(&str, &[u8], &str, &str); 2] = [
        ("13", b"failed%20to%20decode%20Protobuf%20message", "3", "invalid_request"),
        ("11", b"Error,%20decoded%20message%20length%20too%20large", "8", "payload_too_large"),
    ];
    let headers = response.headers_mut();
    let (Some(status), Some(message)) = (headers.get("grpc-status"), headers.get("grpc-message"))
    else {
        return;
    };
    let Some(&(_, _, ours, code)) = DECODER
        .iter()
        .find(|(theirs, start, ..)| status == *theirs && message.as_bytes().starts_with(start))
    else {
        return;
    };
    headers.insert("grpc-status", http::HeaderValue::from_static(ours));
    headers.insert("hangar-error-code", http::HeaderValue::from_static(code));
}

/// A path the generated server does not know (another service, a method of none) is
/// UNIMPLEMENTED with a message that names it (tonic's has none).
fn unserved_says_so<B>(response: &mut http::Response<B>, path: &str) {
    let headers = response.headers_mut();
    let unimplemented = headers.get("grpc-status").is_some_and(|s| s == "12");
    if !unimplemented || headers.get("grpc-message").is_some_and(|m| !m.is_empty()) {
        return;
    }
    let message = format!(
        "no RPC at `{path}`: Hangar serves the KServe v2 service inference.GRPCInferenceService"
    );
    // grpc-message is percent-encoded: printable ASCII but `%` stays as it is.
    let encoded: String = message
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    if let Ok(value) = http::HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
}

/// A late body as the gRPC status the call ends with.
fn late(error: StdError) -> StdError {
    if error.is::<BodyTimeout>() {
        let error = ApiError::new(HttpCode::BodyTimeout, error.to_string());
        return Box::new(super::status::status(error));
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rpc_takes_the_auth_class_of_the_route_it_mirrors() {
        use crate::router::{Auth, auth_of};
        let rows = [
            ("ServerLive", Auth::Open),
            ("ServerReady", Auth::Open),
            ("RepositoryIndex", Auth::Admin),
            ("RepositoryModelLoad", Auth::Admin),
            ("RepositoryModelUnload", Auth::Admin),
            ("ModelInfer", Auth::Inference),
            ("NoSuchRpc", Auth::Inference),
        ];
        for (rpc, auth) in rows {
            let (method, path) = route_of(&format!("/inference.GRPCInferenceService/{rpc}"));
            assert_eq!(auth_of(&method, path), auth, "{rpc}");
        }
        let (method, path) = route_of("/other.Service/ServerLive");
        assert_eq!(auth_of(&method, path), Auth::Inference, "another service's path");
    }

    #[test]
    fn tonics_decoder_and_path_errors_become_the_callers_with_a_message() {
        let answer = |status: &str, message: Option<&str>, path: &str| {
            let mut response = http::Response::new(());
            response.headers_mut().insert("grpc-status", status.parse().unwrap());
            if let Some(m) = message {
                response.headers_mut().insert("grpc-message", m.parse().unwrap());
            }
            decode_errors_as_callers(&mut response);
            unserved_says_so(&mut response, path);
            let header =
                |name| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
            (header("grpc-status"), header("hangar-error-code"), header("grpc-message"))
        };
        let rows = [
            (
                "13",
                Some("failed%20to%20decode%20Protobuf%20message: x"),
                "3",
                Some("invalid_request"),
            ),
            (
                "11",
                Some("Error,%20decoded%20message%20length%20too%20large: 9"),
                "8",
                Some("payload_too_large"),
            ),
            // tonic's framing errors stay INTERNAL, as gRPC says they must.
            ("13", Some("protocol%20error: compressed-flag"), "13", None),
            ("13", Some("Unexpected%20EOF%20decoding%20stream."), "13", None),
            ("13", Some("Missing%20request%20message."), "13", None),
            ("5", Some("failed%20to%20decode"), "5", None),
        ];
        for (status, message, want, code) in rows {
            let (got, got_code, _) = answer(status, message, "/p");
            assert_eq!(
                (got.as_deref(), got_code.as_deref()),
                (Some(want), code),
                "{status} {message:?}"
            );
        }
        let (status, _, message) = answer("12", None, "/other.Service/50%");
        assert_eq!(status.as_deref(), Some("12"));
        let message = message.unwrap();
        assert!(message.contains("`/other.Service/50%25`"), "{message}");
        let (_, _, kept) = answer("12", Some("ModelInfer: use POST"), "/p");
        assert_eq!(kept.as_deref(), Some("ModelInfer: use POST"), "a message of Hangar's stays");
    }
}
