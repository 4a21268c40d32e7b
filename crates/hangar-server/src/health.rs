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
    /// Whether every enabled model of start-up's set is loaded (the enabled models start-up
    /// left out by rule, `no_slot` and `no_room`, do not hold readiness back).
    ready: bool,
    /// The enabled models that hold readiness back.
    not_loaded: Vec<String>,
    /// Every enabled model that is not serving, in config order, with the reason.
    not_serving: Vec<NotServing>,
}

/// An enabled model that is not serving.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct NotServing {
    /// The model.
    model: String,
    /// Why.
    reason: NotServingReason,
    /// The detail (the last error, the refusal), when there is one; while keys are set,
    /// only for callers with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// Whether the server is not ready while this lasts.
    holds_readiness: bool,
}

/// Why an enabled model is not serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotServingReason {
    /// Start-up has not reached it yet.
    StartUpPending,
    /// A load is in progress.
    Loading,
    /// An unload is in progress.
    Unloading,
    /// Its last load failed or its runtime crashed (`message` says why).
    LoadFailed,
    /// It failed too often; loads on demand are refused for a while.
    Quarantined,
    /// Start-up left it unloaded: more models of its type are enabled than
    /// `max_loaded_models` allows (`hangard config check` warns).
    NoSlot,
    /// Start-up did not load it: only evicting another enabled or pinned model would have
    /// made room (`message` says which).
    NoRoom,
    /// Unloaded after start-up (by an operator, for idleness, or evicted).
    Unloaded,
}

impl From<hangar_runtime::NotServingReason> for NotServingReason {
    fn from(reason: hangar_runtime::NotServingReason) -> Self {
        use hangar_runtime::NotServingReason as R;
        match reason {
            R::StartUpPending => Self::StartUpPending,
            R::Loading => Self::Loading,
            R::Unloading => Self::Unloading,
            R::LoadFailed => Self::LoadFailed,
            R::Quarantined => Self::Quarantined,
            R::NoSlot => Self::NoSlot,
            R::NoRoom => Self::NoRoom,
            R::Unloaded => Self::Unloaded,
        }
    }
}

/// In an enabled model's admin row while it is not serving: why, and whether the server is
/// not ready while this lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NotServingInfo {
    /// Why.
    pub reason: NotServingReason,
    /// Whether `/readyz` answers 503 while this lasts (false for the models start-up left
    /// out by rule: `no_slot`, `no_room`).
    pub holds_readiness: bool,
}

impl From<hangar_runtime::NotServingInfo> for NotServingInfo {
    fn from(n: hangar_runtime::NotServingInfo) -> Self {
        Self { reason: n.reason.into(), holds_readiness: n.holds_readiness }
    }
}

impl From<hangar_runtime::NotServing> for NotServing {
    fn from(n: hangar_runtime::NotServing) -> Self {
        Self {
            model: n.model.to_string(),
            reason: n.info.reason.into(),
            message: n.message,
            holds_readiness: n.info.holds_readiness,
        }
    }
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
    // While keys are set, a caller without one is told the reasons, not the error texts.
    let disclose = crate::auth::discloses(&ctx.state.options, &ctx.headers);
    let not_serving: Vec<NotServing> = ctx
        .state
        .manager
        .not_serving()
        .into_iter()
        .map(|n| NotServing { message: n.message.clone().filter(|_| disclose), ..n.into() })
        .collect();
    let not_loaded: Vec<String> =
        not_serving.iter().filter(|n| n.holds_readiness).map(|n| n.model.clone()).collect();
    let ready = not_loaded.is_empty();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    Ok(json_response(status, &Readyz { ready, not_loaded, not_serving }))
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
