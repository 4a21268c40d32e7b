//! Weight-control routes of one model (`admin-control.md`, under `/v1/admin/models/{name}`):
//! pause, continue, update weights from disk, the weights checker; and leases.

use hangar_runtime::WeightUpdate;
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admin::ModelRow;
use crate::body::{Response, json_response, parse_json};
use crate::error::ApiError;
use crate::router::Ctx;
use crate::wire::{Lease, PauseMode, WeightsAction, WeightsReport};

/// Body of `POST …/pause`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseBody {
    /// `abort` (default): queued and running requests end with `generation_aborted`;
    /// `retract`: running generations go back to the head of the queue and resume after
    /// continue; `in_place`: queued requests wait, running ones finish.
    #[serde(default)]
    pub(crate) mode: Option<PauseMode>,
}

/// Body of `POST …/update-weights-from-disk` (SGLang's fields).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateWeightsBody {
    /// The model: at `/update_weights_from_disk`, needed only when more than one model is
    /// loaded; under `/v1/admin/models/{name}/`, absent or that name.
    #[serde(default)]
    pub(crate) model: Option<String>,
    /// The new weights (a file or directory the model's engine loads); default: the
    /// configured `model_path`.
    #[serde(default)]
    pub(crate) model_path: Option<String>,
    /// Accepted for SGLang compatibility; the engine reads the format it always reads.
    #[serde(default)]
    #[expect(dead_code, reason = "accepted for SGLang compatibility, not used")]
    pub(crate) load_format: Option<String>,
    /// Abort running and queued requests instead of refusing with 409 while requests run.
    #[serde(default)]
    pub(crate) abort_all_requests: Option<bool>,
    /// Stay paused after the update.
    #[serde(default)]
    pub(crate) keep_pause: Option<bool>,
    /// The version label the model shows after the update; absent keeps the current one.
    #[serde(default)]
    pub(crate) weight_version: Option<String>,
    /// Accepted for SGLang compatibility; a new runtime starts with an empty cache anyway.
    #[serde(default)]
    #[expect(dead_code, reason = "accepted for SGLang compatibility, not used")]
    pub(crate) flush_cache: Option<bool>,
}

impl UpdateWeightsBody {
    pub(crate) fn update(self) -> WeightUpdate {
        WeightUpdate {
            model_path: self.model_path,
            abort_all_requests: self.abort_all_requests.unwrap_or(false),
            keep_pause: self.keep_pause.unwrap_or(false),
            weight_version: self.weight_version,
        }
    }
}

/// Body of `POST …/weights-checker`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WeightsCheckerBody {
    /// `checksum`, `snapshot`, `compare` or `reset_tensors` (refused with 501).
    pub(crate) action: WeightsAction,
}

/// The weights checker's answer.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WeightsCheckerResponse {
    /// The model.
    pub(crate) model: String,
    /// What the checker found.
    #[serde(flatten)]
    pub(crate) report: WeightsReport,
}

/// `POST /v1/admin/models/{name}/pause`.
pub(crate) async fn pause(ctx: Ctx) -> Result<Response, ApiError> {
    let body: PauseBody = parse_json(&ctx.body, true)?;
    let mode = body.mode.unwrap_or_default();
    let snapshot = ctx.state.manager.pause(ctx.name(), mode.into()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/continue`.
pub(crate) async fn resume(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.resume(ctx.name()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/sleep`.
pub(crate) async fn sleep(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.sleep(ctx.name()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/wake`.
pub(crate) async fn wake(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.wake(ctx.name()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/update-weights-from-disk`.
pub(crate) async fn update_weights(ctx: Ctx) -> Result<Response, ApiError> {
    let body: UpdateWeightsBody = parse_json(&ctx.body, true)?;
    if body.model.as_deref().is_some_and(|m| m != ctx.name()) {
        let message = format!("model: the body names another model than the path ({})", ctx.name());
        return Err(ApiError::bad_request(message).with_field("model"));
    }
    let snapshot = ctx.state.manager.update_weights_from_disk(ctx.name(), body.update()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/weights-checker`.
pub(crate) async fn weights_checker(ctx: Ctx) -> Result<Response, ApiError> {
    let body: WeightsCheckerBody = parse_json(&ctx.body, false)?;
    let report = ctx.state.manager.check_weights(ctx.name(), body.action.into()).await?;
    let response = WeightsCheckerResponse { model: ctx.name().to_owned(), report: report.into() };
    Ok(json_response(StatusCode::OK, &response))
}

/// Body of `POST …/leases`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseBody {
    /// Who holds the lease (a job, a user); at most 256 bytes.
    pub(crate) owner: String,
    /// How long it holds the model, 1 to 604800 seconds; renew before it ends.
    pub(crate) ttl_seconds: u32,
}

/// Body of `POST …/leases/{id}` (renew).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenewBody {
    /// The new length; the lease's own when absent.
    #[serde(default)]
    pub(crate) ttl_seconds: Option<u32>,
}

/// A lease taken: the lease and the model it holds.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct LeaseResponse {
    /// The lease (its `id` renews and releases it).
    pub(crate) lease: Lease,
    /// The model, loaded.
    pub(crate) model: ModelRow,
}

/// `POST /v1/admin/models/{name}/leases`.
pub(crate) async fn acquire_lease(ctx: Ctx) -> Result<Response, ApiError> {
    let body: LeaseBody = parse_json(&ctx.body, false)?;
    let lease = ctx.state.manager.acquire_lease(ctx.name(), &body.owner, body.ttl_seconds).await?;
    let model = ctx.state.rows.row(&ctx.state.manager.model(ctx.name())?);
    Ok(json_response(StatusCode::OK, &LeaseResponse { lease: lease.into(), model }))
}

/// `POST /v1/admin/models/{name}/leases/{id}`.
pub(crate) async fn renew_lease(ctx: Ctx) -> Result<Response, ApiError> {
    let body: RenewBody = parse_json(&ctx.body, true)?;
    let lease = ctx.state.manager.renew_lease(ctx.name(), lease_id(&ctx), body.ttl_seconds).await?;
    Ok(json_response(StatusCode::OK, &Lease::from(lease)))
}

/// `DELETE /v1/admin/models/{name}/leases/{id}`.
pub(crate) async fn release_lease(ctx: Ctx) -> Result<Response, ApiError> {
    let lease = ctx.state.manager.release_lease(ctx.name(), lease_id(&ctx)).await?;
    Ok(json_response(StatusCode::OK, &Lease::from(lease)))
}

fn lease_id(ctx: &Ctx) -> &str {
    ctx.params.get(1).map_or("", String::as_str)
}
