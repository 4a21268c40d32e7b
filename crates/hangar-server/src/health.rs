//! Operations routes: `/healthz`, `/readyz`, `/metrics`.

use http::{HeaderValue, StatusCode, header};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::body::{Response, json_response, text_response};
use crate::error::ApiError;
use crate::openai::constant;
use crate::router::Ctx;

constant!(
    /// `ok`.
    StatusOk = "ok"
);

/// `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Healthz {
    /// Always `ok`.
    status: StatusOk,
    /// Seconds since the service started.
    uptime_seconds: u64,
}

/// `GET /readyz`, with 200 or 503.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Readyz {
    /// Whether every model with `enabled: true` is loaded.
    ready: bool,
    /// The enabled models that are not loaded.
    not_loaded: Vec<String>,
}

/// The content type of the Prometheus text format.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of the OpenMetrics text format (the same text).
pub(crate) const OPENMETRICS_TEXT: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub(crate) async fn healthz(ctx: Ctx) -> Result<Response, ApiError> {
    let uptime_seconds = ctx.state.started.elapsed().as_secs();
    Ok(json_response(StatusCode::OK, &Healthz { status: StatusOk::Value, uptime_seconds }))
}

/// Names of models with `enabled: true` that are not loaded.
pub(crate) fn not_ready(ctx: &Ctx) -> Vec<String> {
    not_ready_models(&ctx.state.manager)
}

/// Names of `manager`'s models with `enabled: true` that are not loaded.
pub(crate) fn not_ready_models(manager: &hangar_runtime::Manager) -> Vec<String> {
    manager.not_ready().into_iter().map(|n| n.to_string()).collect()
}

pub(crate) async fn readyz(ctx: Ctx) -> Result<Response, ApiError> {
    let not_loaded = not_ready(&ctx);
    let ready = not_loaded.is_empty();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok(json_response(status, &Readyz { ready, not_loaded }))
}

/// `GET /metrics`: OpenMetrics when the scraper asks for it, else Prometheus text.
pub(crate) async fn metrics(ctx: Ctx) -> Result<Response, ApiError> {
    let text = ctx.state.metrics.render();
    let openmetrics = ctx
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let content_type = if openmetrics { OPENMETRICS_TEXT } else { PROMETHEUS_TEXT };
    let mut response = text_response(StatusCode::OK, content_type, text);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
