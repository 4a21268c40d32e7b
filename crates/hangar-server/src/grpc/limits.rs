//! The gRPC listener's share of the connection limits ([`crate::listen`]): each call counts
//! as a request in flight on its connection, so the cap never sheds a connection with a
//! call running and the idle deadline starts when its last call ends; a request body has
//! `connections.body_read_timeout_s` to arrive, else the call ends DEADLINE_EXCEEDED with
//! `hangar-error-code: body_timeout`.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError};

use crate::error::{ApiError, HttpCode};
use crate::listen::{BodyTimeout, ConnTag, Deadline, Tracked};

/// A gRPC service under the connection limits. Its connections come from
/// [`crate::listen::Acceptor`], which tonic's `connect_info` hands to each request as a
/// [`ConnTag`].
#[derive(Clone)]
pub(super) struct Limited<S> {
    inner: S,
    body_timeout: Duration,
}

impl<S> Limited<S> {
    pub(super) fn new(inner: S, body_timeout: Duration) -> Self {
        Self { inner, body_timeout }
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
        let in_flight = req.extensions().get::<ConnTag>().map(ConnTag::request);
        let timeout = self.body_timeout;
        let req = req.map(|body| Body::new(Deadline::new(body, timeout).map_err(late)));
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
