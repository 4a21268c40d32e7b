//! One error vocabulary: [`ErrorCode`] (the control plane's codes and the HTTP layer's own),
//! the one mapping from a code to its HTTP status ([`ErrorCode::status`]), and the one
//! envelope type ([`ErrorBody`]) used by JSON error responses and SSE error events alike.
//! The KServe v2 routes answer their spec's [`V2ErrorBody`] instead.

use hangar_runtime::ManagerError;
use hangar_runtime::ModelState;
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admin::ModelRow;
use crate::body::{Response, json_response};

/// Every machine-readable error code Hangar answers with: the `code` of the error envelope
/// and the `outcome` label of request metrics. Each code has exactly one HTTP status.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    /// 404: the model is not configured.
    UnknownModel,
    /// 503: the model is unloaded; requests are admitted only while it is loaded.
    ModelNotLoaded,
    /// 503: the model is loading.
    ModelLoading,
    /// 503: the model is unloading.
    ModelUnloading,
    /// 503: the model's last load failed or its runtime crashed; see `last_error`.
    ModelFailed,
    /// 429: the model's request queue is full.
    QueueFull,
    /// 409: the model's state does not allow the operation now (unload while loading, load
    /// while unloading); `runtime_state` says which state.
    StateConflict,
    /// 422: the body is not valid JSON or fails the request schema; the message carries the
    /// parser's line and column, `field` names the offending field when one is to blame.
    InvalidRequestBody,
    /// 400: load options are well-formed but wrong for the model's backend or state.
    InvalidLoadRequest,
    /// 400: the load ran and failed (the model is `failed`, `last_error` says why), or a
    /// reload failed and the previous runtime keeps serving.
    LoadFailed,
    /// 500: the engine crashed (its process exited) while serving the request; the model is
    /// now `failed` and `last_error` has the exit status and last log lines.
    BackendCrashed,
    /// 499: the caller went away (only logged and counted).
    Cancelled,
    /// 400: the request is not valid for the model or the route.
    InvalidRequest,
    /// 400: the model's engine does not support what the request asks.
    Unsupported,
    /// 500: the engine failed the request.
    RuntimeError,
    /// 502: a forwarding engine (llama-server, vllm serve, a remote API) answered with an
    /// error of its own; the message carries its status and message.
    UpstreamError,
    /// 502: a forwarding engine's answer was larger than `limits.max_answer_bytes`; it was
    /// cut, and nothing of it reached the client.
    UpstreamAnswerTooLarge,
    /// 503: the engine could not be reached or did not answer in time (it is still running).
    BackendUnavailable,
    /// 400: the requested `thinking` mode is not one of the model's `thinking_modes`.
    ThinkingUnsupported,
    /// 400: the route serves another model type (embeddings from an llm, …).
    ModelTypeMismatch,
    /// 404: no route matches the request path.
    NotFound,
    /// 405: the path exists, but not with this method (see the `Allow` header).
    MethodNotAllowed,
    /// 413: the body exceeds `max_request_body_bytes`.
    PayloadTooLarge,
    /// 408: the body did not arrive in full within `connections.body_read_timeout_s` of the
    /// request head; the connection is closed.
    BodyTimeout,
    /// 401: an admin route was called without `Authorization: Bearer <admin key>`.
    Unauthorized,
    /// 403: the admin key given is not the configured one.
    Forbidden,
    /// 404: the multi-model unload names a model that is not loaded.
    NothingToUnload,
    /// 400: KServe v2 model readiness of a configured model that is not ready.
    ModelNotReady,
    /// 503: another admin operation on the model (load, unload, …) held it for longer than
    /// `admin_lock_timeout_s`; nothing was done.
    AdminBusy,
    /// 503: an operator aborted the request (a pause with mode `abort`, a weight update with
    /// `abort_all_requests`); retry once the model continues.
    GenerationAborted,
    /// 409: a weight update while requests run, without `abort_all_requests` and without a
    /// `retract` pause; nothing was done.
    RequestsActive,
    /// 422: the weights checker could not read or parse the model's weights, or `compare`
    /// found no snapshot.
    WeightsUnreadable,
    /// 501: an operation Hangar deliberately does not perform (tensor and distributed
    /// weight updates, `reset_tensors`); the message says what to use instead.
    NotImplemented,
    /// 404: the model has no live lease of that id (released or expired).
    LeaseNotFound,
    /// 409: the load could only proceed by evicting pinned or leased models (named in the
    /// message); nothing was evicted.
    SlotsPinned,
    /// 503: the model failed to load or crashed too often and is quarantined; `retry_after`
    /// (and the `Retry-After` header) says when a request may load it again. An explicit
    /// load lifts the quarantine.
    ModelQuarantined,
    /// 507: the model does not fit in the VRAM budget even after evicting every model that
    /// may be evicted; `vram_shortfall` says how much is missing and which models hold the
    /// memory. Nothing was evicted.
    InsufficientVram,
    /// 403: a browser request from an origin other than the server's own pages and
    /// `http.allowed_origins` (or `Origin: null`, or `Sec-Fetch-Site: cross-site`).
    OriginNotAllowed,
    /// 403: the `Host` is not a name this listener answers (on a loopback listener: not a
    /// loopback name, an IP address or in `http.allowed_hosts`; DNS rebinding).
    HostNotAllowed,
    /// 405: `GET /weights_checker` would pause the loaded model (a checksum or compare while
    /// it serves); a `GET` changes nothing, so use `POST`.
    WouldPause,
    /// 400: a list in the request is longer than its `limits` allow (messages, input items,
    /// embedding inputs, documents, tools, stop sequences) or a stop sequence is too long;
    /// the message names the field, its size and the limit, `field` the field. Nothing
    /// reached the engine.
    LimitExceeded,
    /// 504: the request ran past `limits.request_timeout_s` and was cancelled, its slot
    /// freed. A stream that had started ends with this error as its last event instead.
    DeadlineExceeded,
    /// 429: the model already has `limits.max_leases_per_model` live leases; nothing was
    /// done. Retry once a lease is released or expires.
    TooManyLeases,
}

impl ErrorCode {
    /// The one mapping from a code to its HTTP status.
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            UnknownModel | NotFound | NothingToUnload | LeaseNotFound => StatusCode::NOT_FOUND,
            ModelNotLoaded | ModelLoading | ModelUnloading | ModelFailed | BackendUnavailable
            | AdminBusy | GenerationAborted | ModelQuarantined => StatusCode::SERVICE_UNAVAILABLE,
            QueueFull | TooManyLeases => StatusCode::TOO_MANY_REQUESTS,
            StateConflict | RequestsActive | SlotsPinned => StatusCode::CONFLICT,
            InvalidRequestBody | WeightsUnreadable => StatusCode::UNPROCESSABLE_ENTITY,
            NotImplemented => StatusCode::NOT_IMPLEMENTED,
            InvalidLoadRequest | LoadFailed | InvalidRequest | Unsupported
            | ThinkingUnsupported | ModelTypeMismatch | ModelNotReady | LimitExceeded => {
                StatusCode::BAD_REQUEST
            }
            DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            BackendCrashed | RuntimeError => StatusCode::INTERNAL_SERVER_ERROR,
            UpstreamError | UpstreamAnswerTooLarge => StatusCode::BAD_GATEWAY,
            Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            MethodNotAllowed | WouldPause => StatusCode::METHOD_NOT_ALLOWED,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Unauthorized => StatusCode::UNAUTHORIZED,
            Forbidden | OriginNotAllowed | HostNotAllowed => StatusCode::FORBIDDEN,
            InsufficientVram => StatusCode::INSUFFICIENT_STORAGE,
        }
    }

    /// The snake_case code.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl From<hangar_runtime::ErrorCode> for ErrorCode {
    fn from(code: hangar_runtime::ErrorCode) -> Self {
        // Exhaustive: a runtime code without its answer here does not compile.
        use hangar_runtime::ErrorCode as R;
        match code {
            R::UnknownModel => Self::UnknownModel,
            R::ModelNotLoaded => Self::ModelNotLoaded,
            R::ModelLoading => Self::ModelLoading,
            R::ModelUnloading => Self::ModelUnloading,
            R::ModelFailed => Self::ModelFailed,
            R::QueueFull => Self::QueueFull,
            R::StateConflict => Self::StateConflict,
            R::ThinkingUnsupported => Self::ThinkingUnsupported,
            R::ModelTypeMismatch => Self::ModelTypeMismatch,
            R::InvalidRequestBody => Self::InvalidRequestBody,
            R::InvalidLoadRequest => Self::InvalidLoadRequest,
            R::LoadFailed => Self::LoadFailed,
            R::BackendCrashed => Self::BackendCrashed,
            R::Cancelled => Self::Cancelled,
            R::InvalidRequest => Self::InvalidRequest,
            R::Unsupported => Self::Unsupported,
            R::RuntimeError => Self::RuntimeError,
            R::UpstreamError => Self::UpstreamError,
            R::UpstreamAnswerTooLarge => Self::UpstreamAnswerTooLarge,
            R::BackendUnavailable => Self::BackendUnavailable,
            R::AdminBusy => Self::AdminBusy,
            R::GenerationAborted => Self::GenerationAborted,
            R::RequestsActive => Self::RequestsActive,
            R::WeightsUnreadable => Self::WeightsUnreadable,
            R::NotImplemented => Self::NotImplemented,
            R::LeaseNotFound => Self::LeaseNotFound,
            R::SlotsPinned => Self::SlotsPinned,
            R::ModelQuarantined => Self::ModelQuarantined,
            R::InsufficientVram => Self::InsufficientVram,
            R::WouldPause => Self::WouldPause,
            R::TooManyLeases => Self::TooManyLeases,
            R::DeadlineExceeded => Self::DeadlineExceeded,
        }
    }
}

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
}

/// Why a model does not fit in the VRAM budget (`insufficient_vram`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VramShortfallBody {
    /// What the model is expected to take, in MiB (`vram_detail.admission_mib`).
    pub needed_mib: u64,
    /// The VRAM budget left now over every GPU, in MiB (negative when over budget).
    pub free_mib: i64,
    /// What is still missing after evicting every model that may be evicted, in MiB.
    pub missing_mib: u64,
    /// Loaded models holding GPU memory, largest first.
    pub holders: Vec<VramHolder>,
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
}

/// The KServe v2 error envelope of the model-repository routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct V2ErrorBody {
    /// Human-readable message.
    pub error: String,
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            model: None,
            field: None,
            runtime_state: None,
            retry_after: None,
            vram_shortfall: None,
        }
    }

    /// Names the offending field.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 422 `invalid_request_body`.
    pub(crate) fn body(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequestBody, message)
    }

    /// 400 `invalid_request`.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
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
            },
        }
    }

    /// The `{"error": {"code", "message", …}}` response (with `Retry-After` when the error
    /// has one).
    pub fn into_response(self) -> Response {
        let retry_after = self.retry_after;
        with_retry_after(json_response(self.status(), &self.to_body()), retry_after)
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
        let mut api = ApiError::new(err.code().into(), err.to_string());
        match err {
            ManagerError::LoadFailed { snapshot, .. } => {
                api.model = Some(Box::new(ModelRow::of(&snapshot)));
            }
            ManagerError::InvalidLoadSchema { field, .. } => api.field = Some(field),
            ManagerError::InvalidLoadRequest { field, .. } => api.field = field,
            ManagerError::Conflict { state, .. } => api.runtime_state = Some(state),
            ManagerError::Quarantined { quarantine, .. } => {
                api.retry_after = Some(quarantine.retry_after_s);
            }
            ManagerError::InsufficientVram { shortfall, .. } => {
                let holders = shortfall.holders.iter();
                api.vram_shortfall = Some(Box::new(VramShortfallBody {
                    needed_mib: shortfall.needed_mib,
                    free_mib: shortfall.free_mib,
                    missing_mib: shortfall.missing_mib,
                    holders: holders
                        .map(|(model, vram_mib, held)| VramHolder {
                            model: model.to_string(),
                            vram_mib: *vram_mib,
                            held: *held,
                        })
                        .collect(),
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
    use strum::IntoEnumIterator;

    #[test]
    fn every_runtime_code_has_its_twin() {
        for code in hangar_runtime::ErrorCode::iter() {
            assert_eq!(ErrorCode::from(code).as_str(), code.as_str());
        }
    }

    #[test]
    fn serde_and_strum_agree_on_names() {
        for code in ErrorCode::iter() {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }

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
                ManagerError::Conflict { state: ModelState::Unloading, message: "m".into() },
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
