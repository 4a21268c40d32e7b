//! Admin routes (`runtime-admin-api.md`): list, show, load, unload, logs, events, GPU memory,
//! and weight control (`admin-control.md`): pause, continue, weight updates, checksums.

mod control;
mod events;
mod list;
mod logs;
mod reload;
mod row;

use std::num::NonZeroU32;
use std::sync::Arc;

use hangar_config::{LOAD_FIELDS, LoadValueType, ModelType};
use hangar_runtime::{LoadOptions, ModelFilter};
use http::StatusCode;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

pub(crate) use control::{
    LeaseBody, LeaseResponse, PauseBody, RenewBody, UpdateWeightsBody, WeightsCheckerBody,
    WeightsCheckerResponse, acquire_lease, pause, release_lease, renew_lease, resume, sleep,
    update_weights, wake, weights_checker,
};
pub(crate) use events::{EventOut, EventsQuery, events};
pub(crate) use logs::{LogLineOut, LogsQuery, LogsResponse, logs};
pub use reload::{ConfigSource, ReloadResponse};
pub(crate) use reload::{reload, reload_config};
pub use row::ModelRow;
pub(crate) use row::StaticRows;

use crate::body::{Response, integral_floats_to_integers, json_response, parse_json};
use crate::error::ApiError;
use crate::router::Ctx;
use crate::wire::{ModelState, VramDetail, VramEstimateSource};

/// `GET /v1/admin/models`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelsResponse {
    /// The configured models that pass the filters, in config order.
    pub models: Vec<ModelRow>,
}

/// Filters of `GET /v1/admin/models`; each one absent matches every model.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct ModelsQuery {
    /// Only models in this runtime state.
    state: Option<ModelState>,
    /// Only models of this type.
    #[serde(rename = "type")]
    model_type: Option<ModelType>,
}

/// Body of `POST /v1/admin/models/{name}/load`; every field is optional and the body may
/// be empty. Its schema lists every backend's live-load fields (from `hangar-config`'s one
/// declaration); which of them a model takes is its `load_constraints`.
#[derive(Debug)]
pub(crate) struct LoadBody;

impl JsonSchema for LoadBody {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AdminLoadBody".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut properties = Map::new();
        properties.insert(
            "replicas".into(),
            json!({
                "description": "Replicas for this load, 1..=replica_max; the configured count when absent or null.",
                "type": ["integer", "null"], "minimum": 1, "maximum": u32::MAX,
            }),
        );
        properties.extend(override_properties());
        json_schema!({
            "description": "Replicas and backend-specific runtime-only overrides for one load. Key presence matters: `null` overrides the configured value with the engine default. Fields of another backend answer 400 invalid_load_request.",
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
        })
    }
}

/// The schema of each live-load field, by name: its JSON type or `null`.
pub(crate) fn override_properties() -> Map<String, Value> {
    LOAD_FIELDS
        .iter()
        .map(|field| {
            let backends: Vec<&str> = field.backends.iter().map(|b| b.as_str()).collect();
            let description = format!("Load override of backend {}.", backends.join(", "));
            let schema = match field.value_type {
                LoadValueType::PositiveInt { max } => json!({
                    "description": description, "type": ["integer", "null"], "minimum": 1, "maximum": max,
                }),
                LoadValueType::Float => {
                    json!({ "description": description, "type": ["number", "null"] })
                }
                LoadValueType::Str => {
                    json!({ "description": description, "type": ["string", "null"] })
                }
                LoadValueType::IndexList => json!({
                    "description": format!("{description} The GPUs (NVML indices) this load may use; null: any the definition allows."),
                    "type": ["array", "null"], "items": { "type": "integer", "minimum": 0 },
                }),
            };
            (field.name.to_owned(), schema)
        })
        .collect()
}

/// One GPU as telemetry reports it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct GpuInfo {
    /// The GPU's index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Memory in use, MiB.
    pub used_mib: u64,
    /// Total memory, MiB.
    pub total_mib: u64,
    /// `used / total` as nvidia-smi shows it.
    pub used_over_total: String,
    /// Hangar's addition: the memory models may fill on this GPU under `vram_budget`, in
    /// MiB; absent without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_mib: Option<u64>,
    /// Hangar's addition: who holds memory on this GPU, as its per-process readings say,
    /// largest first: each loaded model whose engine runs in a child process (its process
    /// tree), and `hangard` itself (`model: null`: its in-process engines, which the
    /// readings cannot tell apart). Memory no listed process owns is in `used_mib` only.
    #[serde(default)]
    pub holders: Vec<GpuHolding>,
}

/// Memory one holder has on one GPU.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct GpuHolding {
    /// The model whose engine's process tree holds it; `null` for `hangard`'s own process.
    pub model: Option<String>,
    /// What it holds on the GPU, in MiB.
    pub mib: u64,
}

/// One model's VRAM estimate.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ModelVram {
    /// The model.
    pub name: String,
    /// Its live state.
    pub runtime_state: ModelState,
    /// `runtime_state == loaded`.
    pub is_loaded: bool,
    /// Per-replica in-flight target from config.
    pub configured_target_inflight: u32,
    /// Per-replica in-flight target in effect.
    pub effective_target_inflight: u32,
    /// Approximate VRAM for `vram_estimate_replica_count` replicas, in MiB.
    pub vram_estimate_mib: Option<u64>,
    /// The replica count the estimate is for.
    pub vram_estimate_replica_count: u32,
    /// Where the estimate comes from.
    pub vram_estimate_source: VramEstimateSource,
    /// Hangar's addition, as in the model row: the figure admission uses and the measured
    /// and GGUF figures.
    pub vram_detail: Option<VramDetail>,
    /// As in the model row: the GPUs the loaded runtimes were placed on, and who chose them.
    pub placement: Option<crate::wire::Placement>,
}

/// `GET /v1/admin/gpu-memory`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct GpuMemoryResponse {
    /// GPUs; empty when telemetry is unavailable.
    pub gpus: Vec<GpuInfo>,
    /// Every model's VRAM estimate.
    pub models: Vec<ModelVram>,
    /// Why `gpus` is empty, when it is.
    pub error: Option<String>,
}

/// `GET /v1/admin/models`: every model passing `?state=` and `?type=`.
pub(crate) async fn list(ctx: Ctx) -> Result<Response, ApiError> {
    let query: ModelsQuery = ctx.query()?;
    let filter = ModelFilter { state: query.state.map(Into::into), model_type: query.model_type };
    Ok(list::response(Arc::clone(&ctx.state), filter))
}

/// `GET /v1/admin/models/{name}`.
pub(crate) async fn show(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.model(ctx.name())?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// Splits a load body into replicas and the override patch.
///
/// # Errors
/// 422 when the body is not a JSON object or `replicas` is not a positive integer.
pub(crate) fn load_options(body: &bytes::Bytes) -> Result<LoadOptions, ApiError> {
    let mut value: Value = parse_json(body, true)?;
    integral_floats_to_integers(&mut value);
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
                    .with_field("replicas")
            })?)
        }
    };
    Ok(LoadOptions { replicas, overrides: fields, ..LoadOptions::default() })
}

/// `POST /v1/admin/models/{name}/load`.
pub(crate) async fn load(ctx: Ctx) -> Result<Response, ApiError> {
    let options = load_options(&ctx.body)?;
    let snapshot = ctx.state.manager.load(ctx.name(), options).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `POST /v1/admin/models/{name}/unload`.
pub(crate) async fn unload(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.unload(ctx.name()).await?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
}

/// `GET /v1/admin/gpu-memory`.
pub(crate) async fn gpu_memory(ctx: Ctx) -> Result<Response, ApiError> {
    let memory = ctx.state.manager.gpu_memory().await;
    let models = memory
        .models
        .into_iter()
        .map(|m| ModelVram {
            name: m.name().to_owned(),
            runtime_state: m.runtime_state.into(),
            is_loaded: m.is_loaded,
            configured_target_inflight: m.configured_target_inflight,
            effective_target_inflight: m.effective_target_inflight,
            vram_estimate_mib: m.vram_estimate_mib,
            vram_estimate_replica_count: m.vram_estimate_replica_count,
            vram_estimate_source: m.vram_estimate_source.into(),
            vram_detail: m.vram_detail.map(Into::into),
            placement: m.placement.map(Into::into),
        })
        .collect();
    let (gpus, error) = match memory.gpus {
        Ok(gpus) => (gpus, None),
        Err(unavailable) => (Vec::new(), Some(unavailable.to_string())),
    };
    let budget = ctx.state.manager.vram_budget();
    let holders = memory.holders;
    let gpus = gpus
        .into_iter()
        .map(|g| GpuInfo {
            holders: holders
                .iter()
                .filter(|h| h.gpu == g.index)
                .map(|h| GpuHolding {
                    model: h.model.as_ref().map(|m| m.as_str().to_owned()),
                    mib: h.mib,
                })
                .collect(),
            budget_mib: budget.map(|b| b.mib_for(g.index, g.total_mib)),
            used_over_total: g.used_over_total(),
            index: g.index,
            name: g.name,
            used_mib: g.used_mib,
            total_mib: g.total_mib,
        })
        .collect();
    Ok(json_response(StatusCode::OK, &GpuMemoryResponse { gpus, models, error }))
}
