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
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|body| Body::new(Tracked::new(body, in_flight))))
        })
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
}
