//! Admin routes (`runtime-admin-api.md`): list, show, load, unload, GPU memory.

use std::num::NonZeroU32;

use hangar_lifecycle::ModelState;
use hangar_runtime::{LoadOptions, ModelSnapshot, VramEstimateSource};
use http::StatusCode;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::body::{Response, json_response, parse_json};
use crate::error::ApiError;
use crate::router::Ctx;

/// `GET /v1/admin/models`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ModelsResponse {
    /// Every configured model, in config order.
    models: Vec<ModelSnapshot>,
}

/// Body of `POST /v1/admin/models/{name}/load`; every field is optional.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
pub(crate) struct LoadBody {
    /// Replicas for this load, 1..=replica_max; the configured count when absent.
    #[schemars(range(min = 1))]
    replicas: Option<u32>,
    /// Backend-specific runtime-only overrides: exactly the fields of the model's
    /// `load_constraints` (e.g. `gguf_n_ctx`, `exllama_cache_quant`). Key presence matters:
    /// `null` overrides the configured value.
    #[schemars(flatten)]
    overrides: Map<String, Value>,
}

/// One GPU as telemetry reports it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuInfo {
    index: u32,
    name: String,
    used_mib: u64,
    total_mib: u64,
    used_over_total: String,
}

/// One model's VRAM estimate.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ModelVram {
    name: String,
    runtime_state: ModelState,
    is_loaded: bool,
    configured_target_inflight: u32,
    effective_target_inflight: u32,
    vram_estimate_mib: Option<u64>,
    vram_estimate_replica_count: u32,
    vram_estimate_source: VramEstimateSource,
}

/// `GET /v1/admin/gpu-memory`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuMemoryResponse {
    /// GPUs; empty when telemetry is unavailable.
    gpus: Vec<GpuInfo>,
    /// Every model's VRAM estimate.
    models: Vec<ModelVram>,
    /// Why `gpus` is empty, when it is.
    error: Option<String>,
}

pub(crate) async fn list(ctx: Ctx) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &ModelsResponse { models: ctx.state.manager.models() }))
}

pub(crate) async fn show(ctx: Ctx) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &ctx.state.manager.model(ctx.name())?))
}

/// Splits a load body into replicas and the override patch.
///
/// # Errors
/// 422 when the body is not a JSON object or `replicas` is not a positive integer.
pub(crate) fn load_options(body: &bytes::Bytes) -> Result<LoadOptions, ApiError> {
    let value: Value = parse_json(body, true)?;
    let Value::Object(fields) = value else {
        return Err(ApiError::body(format!(
            "the load body must be a JSON object, got {}",
            hangar_config::json_kind(&value)
        )));
    };
    split_load_patch(fields)
}

/// Splits a load patch into `replicas` and the backend override fields.
///
/// # Errors
/// 422 when `replicas` is not a positive integer.
pub(crate) fn split_load_patch(mut fields: Map<String, Value>) -> Result<LoadOptions, ApiError> {
    let replicas = match fields.remove("replicas") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let n = v.as_u64().and_then(|n| u32::try_from(n).ok()).and_then(NonZeroU32::new);
            Some(n.ok_or_else(|| {
                ApiError::body(format!("replicas: must be a positive integer, got {v}"))
                    .with("field", "replicas".into())
            })?)
        }
    };
    Ok(LoadOptions { replicas, overrides: fields, ..LoadOptions::default() })
}

pub(crate) async fn load(ctx: Ctx) -> Result<Response, ApiError> {
    let options = load_options(&ctx.body)?;
    let snapshot = ctx.state.manager.load(ctx.name(), options).await?;
    Ok(json_response(StatusCode::OK, &snapshot))
}

pub(crate) async fn unload(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.unload(ctx.name()).await?;
    Ok(json_response(StatusCode::OK, &snapshot))
}

pub(crate) async fn gpu_memory(ctx: Ctx) -> Result<Response, ApiError> {
    let models = ctx
        .state
        .manager
        .models()
        .into_iter()
        .map(|m| ModelVram {
            name: m.name,
            runtime_state: m.runtime_state,
            is_loaded: m.is_loaded,
            configured_target_inflight: m.configured_target_inflight,
            effective_target_inflight: m.effective_target_inflight,
            vram_estimate_mib: m.vram_estimate_mib,
            vram_estimate_replica_count: m.vram_estimate_replica_count,
            vram_estimate_source: m.vram_estimate_source,
        })
        .collect();
    let response = GpuMemoryResponse {
        gpus: Vec::new(),
        models,
        error: Some("GPU telemetry is not available: this build has no NVML probe".into()),
    };
    Ok(json_response(StatusCode::OK, &response))
}
