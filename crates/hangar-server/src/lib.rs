//! Hangar's HTTP surface, on hyper 1.x.
//!
//! This crate owns everything HTTP: routes, JSON bodies, the error envelope and the one
//! mapping from control-plane errors to statuses, admin authentication, server-sent events,
//! the OpenAPI document (generated from the same schemars types the handlers use), and the
//! Prometheus exposition. It calls [`hangar_runtime::Manager`] for everything else.
//!
//! Route groups: admin (`/v1/admin/…`), OpenAI-compatible inference (`/v1/…`),
//! multi-model operations (`/api/v1/…`), the KServe v2 model repository (`/v2/…`), and
//! operations (`/metrics`, `/openapi.json`, `/healthz`, `/readyz`).
//!
//! [`HangarService`] is a cheap-`Clone` hyper service that another hyper host can mount;
//! [`serve`] runs it on a listener with graceful shutdown:
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use hangar_server::{HangarService, ServerOptions, serve};
//!
//! let config = hangar_config::Config::load(std::path::Path::new("fixtures/demo")).unwrap();
//! let backends = hangar_runtime::Backends::new()
//!     .with(Arc::new(hangar_stub::StubBackend::new()));
//! let manager = hangar_runtime::Manager::new(&config, backends);
//! let service = HangarService::new(manager, ServerOptions::from_config(&config));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! serve(listener, service, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod admin;
mod anthropic;
mod auth;
mod body;
mod codes;
mod edge;
mod error;
pub mod grpc;
mod health;
mod kserve;
mod listen;
mod metrics;
mod multi_model;
mod node_metrics;
mod openai;
mod openapi;
mod router;
mod routes;
mod sglang;
mod state;
mod tools;
mod ui;
pub mod wire;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::BodyExt;
use hyper::body::Body;

pub use admin::{
    ConfigSource, GpuInfo, GpuMemoryResponse, ModelRow, ModelVram, ModelsResponse, ReloadResponse,
};
pub use auth::PeerAddr;
pub use body::{Response, ResponseBody};
pub use codes::{ErrorCode, HttpCode, RuntimeCode};
pub use error::{ApiError, ConfigProblem, ErrorBody, ErrorObject, V2ErrorBody};
pub use health::{NotServingInfo, NotServingReason};
pub use listen::serve;
pub use state::ServerOptions;

use router::{Ctx, Match};
use state::AppState;

/// The Hangar HTTP service. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct HangarService {
    state: Arc<AppState>,
}

impl HangarService {
    /// A service over `manager`. Encodes every model's static row parts and the OpenAPI
    /// document once, here.
    pub fn new(manager: hangar_runtime::Manager, options: ServerOptions) -> Self {
        // Page by page: the snapshots of every model at once would be the start-up's peak.
        let (mut rows, mut examples) =
            (admin::StaticRows::default(), router::ExampleModels::default());
        let (all, mut next) = (hangar_runtime::ModelFilter::default(), Some(0));
        while let Some(from) = next {
            let (page, after) = manager.list_page(&all, from, 256);
            rows.add(&page);
            examples.add(&page);
            next = after;
        }
        let keys = openapi::Keys {
            admin: options.admin_api_key.is_some(),
            inference: !options.inference_api_keys.is_empty(),
            metrics: options.http.metrics_require_key,
        };
        let edge = edge::EdgePolicy {
            loopback_listener: options.loopback_listener,
            allowed_origins: options.http.allowed_origins.clone(),
            allowed_hosts: options.http.allowed_hosts.clone(),
        };
        let openapi = openapi::encoded(keys, &examples);
        let options_bodies = options.max_request_bodies_bytes.max(options.max_request_body_bytes);
        Self {
            state: Arc::new(AppState {
                metrics: metrics::Metrics::new(manager.clone()),
                manager,
                options,
                edge,
                shutdown: tokio::sync::watch::Sender::new(false),
                rows,
                openapi,
                bodies: Arc::new(body::BodyBudget::new(options_bodies)),
                started: Instant::now(),
                last_generation: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The manager behind the service.
    pub fn manager(&self) -> &hangar_runtime::Manager {
        &self.state.manager
    }

    /// Re-reads the config from [`ServerOptions::config_source`] and applies its models, as
    /// `POST /v1/admin/config/reload` does (`hangard` calls it on `SIGHUP`).
    ///
    /// # Errors
    /// `invalid_config` with every problem (nothing changed); `reload_unavailable` without
    /// a config source.
    pub async fn reload_config(&self) -> Result<ReloadResponse, ApiError> {
        admin::reload_config(&self.state).await
    }

    /// How the keys let `req` in, from its head alone: the listeners' gate
    /// ([`listen::Gate`]) counts keyless and refused calls per connection before a byte of
    /// a body is read.
    pub(crate) fn call_class<B>(&self, req: &Request<B>) -> listen::CallClass {
        let (method, path) = (req.method(), req.uri().path());
        let auth = router::auth_of(method, path);
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        auth::classify(&self.state.options, auth, method, path, peer, req.headers())
    }

    /// `error` in the envelope of the route family `path` belongs to (v2, Anthropic's, or
    /// Hangar's own).
    pub(crate) fn refuse(&self, path: &str, error: ApiError) -> Response {
        if path == "/v2" || path.starts_with("/v2/") {
            error.into_v2_response()
        } else if anthropic::owns(path) {
            anthropic::error_response(error)
        } else {
            error.into_response()
        }
    }

    /// Answers one request. Never fails: every error is an error response.
    ///
    /// The browser rules come first ([`edge`]): a refused `Origin` or `Host` is answered
    /// before routing, authentication or reading the body. `HEAD` is answered as `GET`
    /// without the body.
    pub async fn handle<B>(&self, req: Request<B>) -> Response
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let verdict = edge::decide(&self.state.edge, req.method(), req.uri(), req.headers());
        // The KServe v2 routes answer their own envelope, refusals included.
        let path = req.uri().path();
        let refuse = |e: ApiError| self.refuse(path, e);
        let cors = match verdict {
            edge::Verdict::Pass { cors } => cors,
            edge::Verdict::Preflight { origin } => {
                let mut response = body::empty_response(http::StatusCode::NO_CONTENT);
                edge::cors_headers(response.headers_mut(), &origin, true);
                return response;
            }
            edge::Verdict::BadOrigin(message) => {
                return refuse(ApiError::new(HttpCode::OriginNotAllowed, message));
            }
            edge::Verdict::BadHost(message) => {
                return refuse(ApiError::new(HttpCode::HostNotAllowed, message));
            }
        };
        let head = req.method() == http::Method::HEAD;
        let mut response = self.route(req).await;
        if let Some(origin) = cors {
            edge::cors_headers(response.headers_mut(), &origin, false);
        }
        if head {
            response = without_body(response);
        }
        response
    }

    async fn route<B>(&self, req: Request<B>) -> Response
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        let (route, params) = match router::find(&parts.method, path) {
            Match::Found(route, params) => (route, params),
            Match::MethodNotAllowed(allow) => {
                let message =
                    format!("{} is not allowed on {path}; allowed: {allow}", parts.method);
                let error = ApiError::new(HttpCode::MethodNotAllowed, message);
                let mut response = if anthropic::owns(path) {
                    anthropic::error_response(error)
                } else {
                    error.into_response()
                };
                if let Ok(allow) = header::HeaderValue::from_str(&allow) {
                    response.headers_mut().insert(header::ALLOW, allow);
                }
                return response;
            }
            Match::NotFound => {
                return ApiError::new(HttpCode::NotFound, format!("no route for {path}"))
                    .into_response();
            }
        };
        let fail = |e: ApiError| match route.group {
            router::Group::Repository => e.into_v2_response(),
            router::Group::Anthropic => anthropic::error_response(e),
            _ => e.into_response(),
        };
        let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0.ip());
        let options = &self.state.options;
        let method = &route.method;
        let caller =
            match auth::Caller::of(options, route.auth, method, route.path, peer, &parts.headers) {
                Ok(caller) => caller,
                Err(e) => return fail(e),
            };
        let limit = self.state.options.max_request_body_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if route.body.is_some() && declared.is_some_and(|n| n > limit as u64) {
            return fail(too_large(limit));
        }
        let mut held = body::Held::none(&self.state.bodies);
        let body = match read_body(route, body, limit, declared, &mut held).await {
            Ok(bytes) => bytes,
            Err(ReadError::TooLarge) => return fail(too_large(limit)),
            Err(ReadError::Full) => return fail(bodies_full(self.state.bodies.max())),
            Err(ReadError::Body(e)) if e.is::<listen::BodyTimeout>() => {
                return fail(ApiError::new(HttpCode::BodyTimeout, e.to_string()));
            }
            Err(ReadError::Body(e)) => {
                return fail(ApiError::bad_request(format!("cannot read the request body: {e}")));
            }
        };
        let ctx = Ctx {
            state: Arc::clone(&self.state),
            params,
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers,
            body,
            caller,
        };
        let response = (route.handler)(ctx).await;
        // The body's share of the budget is held until its handler is done with it.
        drop(held);
        response
    }

    /// The options the service runs with.
    pub(crate) fn options(&self) -> &ServerOptions {
        &self.state.options
    }

    /// Starts the shutdown of the service's long-lived streams: event and log streams send
    /// a last `shutdown` event and end, so a graceful drain is not held open by an idle
    /// browser tab. Requests and generations in flight are not touched.
    pub fn begin_shutdown(&self) {
        self.state.shutdown.send_replace(true);
    }
}

/// `response` without its body (the answer to `HEAD`), keeping the length `GET` would send.
fn without_body(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    if let Some(length) = body.size_hint().exact()
        && !parts.headers.contains_key(header::CONTENT_LENGTH)
    {
        parts.headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(length));
    }
    http::Response::from_parts(parts, http_body_util::Empty::new().map_err(|e| match e {}).boxed())
}

/// Why a request body was not read.
enum ReadError {
    /// Over `max_request_body_bytes`.
    TooLarge,
    /// Over what `max_request_bodies_bytes` has left.
    Full,
    /// The body failed (late, reset).
    Body(Box<dyn std::error::Error + Send + Sync>),
}

/// The body of a request to `route`, up to `limit` bytes, each byte held in `held` (the
/// declared length before the first byte is read). A route that takes no body never reads
/// it: a GET that declares a large body is answered at once (an HTTP/1 connection whose
/// body was left unread closes after the answer).
async fn read_body<B>(
    route: &router::Route,
    body: B,
    limit: usize,
    declared: Option<u64>,
    held: &mut body::Held,
) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if route.body.is_none() {
        return Ok(Bytes::new());
    }
    // Checked against `limit` already.
    let declared = declared.map_or(0, |n| usize::try_from(n).unwrap_or(limit));
    if !held.grow_to(declared) {
        return Err(ReadError::Full);
    }
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut whole: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| ReadError::Body(e.into()))?.into_data() else {
            continue;
        };
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(ReadError::TooLarge);
        }
        if !held.grow_to(total) {
            return Err(ReadError::Full);
        }
        // One chunk is kept as it came; more are joined.
        match first.take() {
            None if whole.is_empty() => first = Some(data),
            None => whole.extend_from_slice(&data),
            Some(earlier) => {
                whole.reserve(declared.max(total).saturating_sub(whole.len()));
                whole.extend_from_slice(&earlier);
                whole.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(whole)))
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(HttpCode::PayloadTooLarge, format!("request body exceeds {limit} bytes"))
}

fn bodies_full(max: usize) -> ApiError {
    let mut error = ApiError::new(
        HttpCode::RequestBodiesFull,
        format!(
            "the request bodies held at once reached {max} bytes (max_request_bodies_bytes); nothing was done, retry shortly"
        ),
    );
    error.retry_after = Some(1);
    error
}

impl<B> hyper::service::Service<Request<B>> for HangarService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}
