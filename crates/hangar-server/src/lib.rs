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
//!     .with(Arc::new(hangar_backend::stub::StubBackend::new()));
//! let manager = hangar_runtime::Manager::new(&config, backends);
//! let service = HangarService::new(manager, ServerOptions::from_config(&config));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! serve(listener, service, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod admin;
mod body;
mod error;
pub mod grpc;
mod health;
mod kserve;
mod listen;
mod metrics;
mod multi_model;
mod openai;
mod openapi;
mod router;
mod routes;
mod sglang;
mod state;
mod tools;
mod ui;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Body;
use subtle::ConstantTimeEq;

pub use admin::{GpuInfo, GpuMemoryResponse, ModelRow, ModelVram, ModelsResponse};
pub use body::{Response, ResponseBody};
pub use error::{ApiError, ErrorBody, ErrorCode, ErrorObject, V2ErrorBody};
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
        let models = manager.models();
        let rows = admin::StaticRows::new(&models);
        let examples = router::ExampleModels::of(&models);
        let keys = openapi::Keys {
            admin: options.admin_api_key.is_some(),
            inference: !options.inference_api_keys.is_empty(),
        };
        let openapi = openapi::encoded(keys, &examples);
        Self {
            state: Arc::new(AppState {
                metrics: metrics::Metrics::new(manager.clone()),
                manager,
                options,
                rows,
                openapi,
                started: Instant::now(),
                last_generation: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The manager behind the service.
    pub fn manager(&self) -> &hangar_runtime::Manager {
        &self.state.manager
    }

    /// Answers one request. Never fails: every error is an error response.
    pub async fn handle<B>(&self, req: Request<B>) -> Response
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
                let mut response =
                    ApiError::new(ErrorCode::MethodNotAllowed, message).into_response();
                if let Ok(allow) = header::HeaderValue::from_str(&allow) {
                    response.headers_mut().insert(header::ALLOW, allow);
                }
                return response;
            }
            Match::NotFound => {
                return ApiError::new(ErrorCode::NotFound, format!("no route for {path}"))
                    .into_response();
            }
        };
        let v2 = route.group == router::Group::Repository;
        let fail = |e: ApiError| if v2 { e.into_v2_response() } else { e.into_response() };
        if let Err(e) = self.authorize(route.auth, &parts.headers) {
            return fail(e);
        }
        let limit = self.state.options.max_request_body_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if route.body.is_some() && declared.is_some_and(|n| n > limit as u64) {
            return fail(too_large(limit));
        }
        let body = match read_body(route, body, limit).await {
            Ok(bytes) => bytes,
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                return fail(too_large(limit));
            }
            Err(e) if e.is::<listen::BodyTimeout>() => {
                return fail(ApiError::new(ErrorCode::BodyTimeout, e.to_string()));
            }
            Err(e) => {
                return fail(ApiError::bad_request(format!("cannot read the request body: {e}")));
            }
        };
        let ctx = Ctx {
            state: Arc::clone(&self.state),
            params,
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers,
            body,
        };
        (route.handler)(ctx).await
    }

    /// Checks the bearer key a route of class `auth` needs: admin routes the admin key;
    /// inference routes an inference key or the admin key; each class is open while it has
    /// no key configured.
    pub(crate) fn authorize(
        &self,
        auth: router::Auth,
        headers: &http::HeaderMap,
    ) -> Result<(), ApiError> {
        let options = &self.state.options;
        // The keys of the class itself: open while there are none; the admin key opens
        // inference routes too. No allocation: this runs on every inference request.
        let (own, class): (&[hangar_config::Secret], &str) = match auth {
            router::Auth::Open => return Ok(()),
            router::Auth::Admin => (options.admin_api_key.as_slice(), "admin"),
            router::Auth::Inference => (&options.inference_api_keys, "inference"),
        };
        if own.is_empty() {
            return Ok(());
        }
        let admin: &[hangar_config::Secret] =
            if auth == router::Auth::Inference { options.admin_api_key.as_slice() } else { &[] };
        let keys = own.iter().chain(admin);
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(given) = given else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                format!("{class} routes need `Authorization: Bearer <{class} key>`"),
            ));
        };
        // `subtle` compares without an early exit on the first differing byte, and every
        // key is compared.
        let valid = keys.fold(subtle::Choice::from(0), |found, key| {
            found | given.as_bytes().ct_eq(key.expose().as_bytes())
        });
        if bool::from(valid) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("the key is not valid for {class} routes"),
            ))
        }
    }
}

/// The body of a request to `route`, up to `limit` bytes. A route that takes no body never
/// reads it: a GET that declares a large body is answered at once (an HTTP/1 connection
/// whose body was left unread closes after the answer).
async fn read_body<B>(
    route: &router::Route,
    body: B,
    limit: usize,
) -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if route.body.is_none() {
        return Ok(Bytes::new());
    }
    Ok(Limited::new(body, limit).collect().await?.to_bytes())
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(ErrorCode::PayloadTooLarge, format!("request body exceeds {limit} bytes"))
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
