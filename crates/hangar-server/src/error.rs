//! Error answers: [`ApiError`] (a code from [`crate::codes`], its message and details) and
//! the one envelope type ([`ErrorBody`]) used by JSON error responses and SSE error events
//! alike. The KServe v2 routes answer their spec's [`V2ErrorBody`] instead.

use hangar_runtime::ManagerError;
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admin::ModelRow;
use crate::body::{Response, json_response};
pub(crate) use crate::codes::{ErrorCode, HttpCode, RuntimeCode};
use crate::wire::ModelState;

/// An error answer: its code (hence its status), message and optional details.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Machine-readable code; decides the status.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// With `load_failed`: the model after the attempt.
    pub model: Option<Box<ModelRow>>,
    /// The offending field, when one is to blame.
    pub field: Option<String>,
    /// With `state_conflict`: the model's state.
    pub runtime_state: Option<ModelState>,
    /// With `model_quarantined`: seconds until the quarantine ends (also sent as the
    /// `Retry-After` header).
    pub retry_after: Option<u64>,
    /// With `insufficient_vram`: what is needed, free and missing, and who holds the memory.
    pub vram_shortfall: Option<Box<VramShortfallBody>>,
    /// With `insufficient_memory`: the same of the host's memory.
    pub memory_shortfall: Option<Box<MemoryShortfallBody>>,
    /// With `invalid_config`: every problem of the config read, as `hangard config check`
    /// lists them.
    pub problems: Option<Vec<ConfigProblem>>,
}

/// One problem of a config file: where, and what (`invalid_config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConfigProblem {
    /// The JSON path at fault (`models.qwen.gguf_n_ctx`), or the file.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

/// Why a model (on the CPU, or a GPU model's host part) does not fit in the host-memory
/// budget (`insufficient_memory`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryShortfallBody {
    /// What the model is expected to take, in MiB (`host_memory.mib`, less a model file
    /// that a loaded model maps already).
    pub needed_mib: u64,
    /// The host-memory budget left now, in MiB (negative when over budget).
    pub free_mib: i64,
    /// What is still missing after evicting every model that may be evicted, in MiB.
    pub missing_mib: u64,
    /// Loaded models holding host memory, largest first.
    pub holders: Vec<MemoryHolder>,
}

/// A loaded model holding host memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryHolder {
    /// The model.
    pub model: String,
    /// The memory admission counts it as holding, in MiB.
    pub mib: u64,
    /// Pinned or leased: it may not be evicted.
    pub held: bool,
}

/// Why a model does not fit in the VRAM budget (`insufficient_vram`). Each GPU is a place
/// of its own: the summary figures are those of the allowed GPU that comes closest, and
/// `gpus` gives every allowed GPU's side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VramShortfallBody {
    /// What the model is expected to take on each of its GPUs, in MiB
    /// (`vram_detail.admission_mib`, divided by `gpus_needed` for a split model).
    pub needed_mib: u64,
    /// The budget left now on the closest GPU, in MiB (negative when over budget).
    pub free_mib: i64,
    /// What is still missing there after evicting every model that may be evicted, in MiB.
    pub missing_mib: u64,
    /// Loaded models holding memory on that GPU, largest first.
    pub holders: Vec<VramHolder>,
    /// How many GPUs the model spreads over at once (`gpu_split`).
    pub gpus_needed: u32,
    /// Each allowed GPU's side; empty when fewer GPUs exist than `gpus_needed`.
    pub gpus: Vec<GpuShortfallBody>,
}

/// One allowed GPU's side of a [`VramShortfallBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuShortfallBody {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// What the model would take on it, in MiB.
    pub needed_mib: u64,
    /// Its budget left now (with any slot victims gone), in MiB.
    pub free_mib: i64,
    /// What is still missing there with every evictable model gone, in MiB (0: it alone
    /// would have room; a split needs more such GPUs).
    pub missing_mib: u64,
    /// Loaded models holding memory on it, largest first.
    pub holders: Vec<VramHolder>,
}

fn holders(holders: &[(hangar_config::ModelName, u64, bool)]) -> Vec<VramHolder> {
    holders
        .iter()
        .map(|(model, vram_mib, held)| VramHolder {
            model: model.to_string(),
            vram_mib: *vram_mib,
            held: *held,
        })
        .collect()
}

/// A loaded model holding GPU memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VramHolder {
    /// The model.
    pub model: String,
    /// The memory admission counts it as holding, in MiB.
    pub vram_mib: u64,
    /// Pinned or leased: it may not be evicted.
    pub held: bool,
}

/// The error envelope of every non-2xx JSON answer (and of SSE error events).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorObject,
}

/// The `error` object of [`ErrorBody`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorObject {
    /// Machine-readable snake_case code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// With `load_failed`: the model after the attempt, `last_error` saying why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Box<ModelRow>>,
    /// With `invalid_request_body` / `invalid_load_request` / `limit_exceeded`: the
    /// offending field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With `state_conflict`: the model's state that does not allow the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_state: Option<ModelState>,
    /// With `model_quarantined`: seconds until the quarantine ends, as in the `Retry-After`
    /// header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// With `insufficient_vram`: what is needed, free and missing, and who holds the memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_shortfall: Option<Box<VramShortfallBody>>,
    /// With `insufficient_memory`: what is needed, free and missing of the host-memory
    /// budget, and which CPU models hold it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_shortfall: Option<Box<MemoryShortfallBody>>,
    /// With `invalid_config`: every problem of the config read, at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<ConfigProblem>>,
}

/// The KServe v2 error envelope of the model-repository routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct V2ErrorBody {
    /// Human-readable message.
    pub error: String,
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: impl Into<ErrorCode>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            model: None,
            field: None,
            runtime_state: None,
            retry_after: None,
            vram_shortfall: None,
            memory_shortfall: None,
            problems: None,
        }
    }

    /// Names the offending field.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 422 `invalid_request_body`.
    pub(crate) fn body(message: impl Into<String>) -> Self {
        Self::new(RuntimeCode::InvalidRequestBody, message)
    }

    /// 400 `invalid_request`.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(RuntimeCode::InvalidRequest, message)
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// The envelope.
    pub fn to_body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                code: self.code,
                message: self.message.clone(),
                model: self.model.clone(),
                field: self.field.clone(),
                runtime_state: self.runtime_state,
                retry_after: self.retry_after,
                vram_shortfall: self.vram_shortfall.clone(),
                memory_shortfall: self.memory_shortfall.clone(),
                problems: self.problems.clone(),
            },
        }
    }

    /// The `{"error": {"code", "message", …}}` response (with `Retry-After` when the error
    /// has one).
    pub fn into_response(self) -> Response {
        let retry_after = self.retry_after;
        with_retry_after(json_response(self.status(), &self.to_body()), retry_after)
    }

    /// This error's status with `body` as its envelope (with `Retry-After` when the error
    /// has one): the Messages API's routes answer Anthropic's.
    pub(crate) fn into_response_with<T: serde::Serialize>(self, body: &T) -> Response {
        let retry_after = self.retry_after;
        with_retry_after(json_response(self.status(), body), retry_after)
    }

    /// The KServe v2 response, `{"error": "…"}`, with the same status.
    pub fn into_v2_response(self) -> Response {
        let retry_after = self.retry_after;
        let response = json_response(self.status(), &V2ErrorBody { error: self.message });
        with_retry_after(response, retry_after)
    }
}

impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> Self {
        let mut api = ApiError::new(err.code(), err.to_string());
        match err {
            ManagerError::LoadFailed { snapshot, .. } => {
                api.model = Some(Box::new(ModelRow::of(&snapshot)));
            }
            ManagerError::InvalidLoadSchema { field, .. } => api.field = Some(field),
            ManagerError::InvalidLoadRequest { field, .. } => api.field = field,
            ManagerError::Conflict { state, .. } => api.runtime_state = Some(state.into()),
            ManagerError::Quarantined { quarantine, .. } => {
                api.retry_after = Some(quarantine.retry_after_s);
            }
            ManagerError::InsufficientVram { shortfall, .. } => {
                let gpus = shortfall.gpus.iter().map(|g| GpuShortfallBody {
                    gpu: g.gpu,
                    needed_mib: g.share_mib,
                    free_mib: g.free_mib,
                    missing_mib: g.missing_mib,
                    holders: holders(&g.holders),
                });
                api.vram_shortfall = Some(Box::new(VramShortfallBody {
                    needed_mib: shortfall.needed_mib,
                    free_mib: shortfall.free_mib,
                    missing_mib: shortfall.missing_mib,
                    holders: holders(&shortfall.holders),
                    gpus_needed: shortfall.gpus_needed,
                    gpus: gpus.collect(),
                }));
            }
            ManagerError::InsufficientMemory { shortfall, .. } => {
                let holders = shortfall.holders.iter().map(|(model, mib, held)| MemoryHolder {
                    model: model.to_string(),
                    mib: *mib,
                    held: *held,
                });
                api.memory_shortfall = Some(Box::new(MemoryShortfallBody {
                    needed_mib: shortfall.needed_mib,
                    free_mib: shortfall.free_mib,
                    missing_mib: shortfall.missing_mib,
                    holders: holders.collect(),
                }));
            }
            _ => {}
        }
        api
    }
}

fn with_retry_after(mut response: Response, seconds: Option<u64>) -> Response {
    if let Some(seconds) = seconds {
        response.headers_mut().insert(http::header::RETRY_AFTER, seconds.into());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_runtime::AdmissionError;

    #[test]
    fn statuses_follow_the_spec() {
        let cases: Vec<(ManagerError, u16, &str)> = vec![
            (AdmissionError::UnknownModel { model: "x".into() }.into(), 404, "unknown_model"),
            (AdmissionError::ModelNotLoaded.into(), 503, "model_not_loaded"),
            (AdmissionError::ModelLoading.into(), 503, "model_loading"),
            (AdmissionError::ModelUnloading.into(), 503, "model_unloading"),
            (AdmissionError::ModelFailed { last_error: "e".into() }.into(), 503, "model_failed"),
            (AdmissionError::QueueFull { depth: 1 }.into(), 429, "queue_full"),
            (
                AdmissionError::GenerationAborted { reason: "r".into() }.into(),
                503,
                "generation_aborted",
            ),
            (
                ManagerError::RequestsActive { model: "m".into(), running: 1 },
                409,
                "requests_active",
            ),
            (ManagerError::Weights { message: "m".into() }, 422, "weights_unreadable"),
            (
                ManagerError::Quarantined {
                    model: "m".into(),
                    quarantine: hangar_runtime::QuarantineInfo {
                        since_unix_ms: 0,
                        until_unix_ms: 30_000,
                        retry_after_s: 30,
                        failures: 3,
                        strike: 1,
                    },
                    last_error: "e".into(),
                },
                503,
                "model_quarantined",
            ),
            (ManagerError::NotImplemented { message: "m".into() }, 501, "not_implemented"),
            (ManagerError::TooManyLeases { model: "m".into(), limit: 2 }, 429, "too_many_leases"),
            (
                ManagerError::DeadlineExceeded {
                    model: "m".into(),
                    timeout: std::time::Duration::from_secs(5),
                },
                504,
                "deadline_exceeded",
            ),
            (
                ManagerError::Conflict {
                    state: hangar_runtime::ModelState::Unloading,
                    message: "m".into(),
                },
                409,
                "state_conflict",
            ),
            (
                ManagerError::InvalidLoadSchema { field: "f".into(), message: "m".into() },
                422,
                "invalid_request_body",
            ),
            (
                ManagerError::InvalidLoadRequest { field: None, message: "m".into() },
                400,
                "invalid_load_request",
            ),
        ];
        for (err, status, code) in cases {
            let api = ApiError::from(err.clone());
            assert_eq!((api.status().as_u16(), api.code.as_str()), (status, code), "{err:?}");
        }
    }
}
