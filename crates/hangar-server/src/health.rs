//! Operations routes: `/healthz`, `/readyz`, `/metrics`.

use http::StatusCode;
use serde_json::json;

use crate::body::{Response, json_response, text_response};
use crate::error::ApiError;
use crate::router::Ctx;

pub(crate) async fn healthz(ctx: Ctx) -> Result<Response, ApiError> {
    let uptime = ctx.state.started.elapsed().as_secs();
    Ok(json_response(StatusCode::OK, &json!({ "status": "ok", "uptime_seconds": uptime })))
}

/// Names of models with `enabled: true` that are not loaded.
pub(crate) fn not_ready(ctx: &Ctx) -> Vec<String> {
    ctx.state
        .manager
        .models()
        .into_iter()
        .filter(|m| m.configured_enabled && !m.is_loaded)
        .map(|m| m.name)
        .collect()
}

pub(crate) async fn readyz(ctx: Ctx) -> Result<Response, ApiError> {
    let waiting = not_ready(&ctx);
    let status = if waiting.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok(json_response(status, &json!({ "ready": waiting.is_empty(), "not_loaded": waiting })))
}

pub(crate) async fn metrics(ctx: Ctx) -> Result<Response, ApiError> {
    let text = ctx.state.metrics.render(&ctx.state.manager);
    Ok(text_response(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", text))
}
