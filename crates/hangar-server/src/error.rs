//! The one place where errors become HTTP statuses and the error envelope.

use hangar_runtime::{ErrorCode, ManagerError};
use http::StatusCode;
use serde_json::{Map, Value, json};

use crate::body::{Response, json_response};

/// An error answer: status, machine-readable code, message, and optional extra fields
/// merged into the envelope's `error` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable snake_case code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Extra fields of the `error` object (e.g. `model` for `load_failed`).
    pub extra: Map<String, Value>,
}

/// Codes produced by the HTTP layer itself (the control plane's are [`ErrorCode`]).
pub(crate) mod codes {
    pub(crate) const NOT_FOUND: &str = "not_found";
    pub(crate) const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    pub(crate) const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    pub(crate) const INVALID_REQUEST_BODY: &str = "invalid_request_body";
    pub(crate) const INVALID_REQUEST: &str = "invalid_request";
    pub(crate) const UNAUTHORIZED: &str = "unauthorized";
    pub(crate) const FORBIDDEN: &str = "forbidden";
    pub(crate) const THINKING_UNSUPPORTED: &str = "thinking_unsupported";
    pub(crate) const INVALID_LOAD_REQUEST: &str = "invalid_load_request";
    pub(crate) const MODEL_NOT_LOADED: &str = "model_not_loaded";
}

impl ApiError {
    /// An error with no extra fields.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), extra: Map::new() }
    }

    /// Adds an extra field to the `error` object.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// 422 with the parser's message (which carries line and column).
    pub(crate) fn body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_REQUEST_BODY, message)
    }

    /// 400 `invalid_request`.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, message)
    }

    /// The `{"error": {"code", "message", …}}` envelope.
    pub fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), self.code.into());
        error.insert("message".into(), self.message.into());
        error.extend(self.extra);
        json_response(self.status, &json!({ "error": error }))
    }

    /// The KServe v2 envelope, `{"error": "…"}`, with the same status.
    pub fn into_v2_response(self) -> Response {
        json_response(self.status, &json!({ "error": self.message }))
    }
}

/// The HTTP status and code of every control-plane error: the one mapping.
pub fn status_of(err: &ManagerError) -> StatusCode {
    match err {
        ManagerError::Conflict { .. } => StatusCode::CONFLICT,
        ManagerError::InvalidLoadSchema { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        ManagerError::InvalidLoadRequest { .. } => StatusCode::BAD_REQUEST,
        ManagerError::LoadFailed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => match err.code() {
            ErrorCode::UnknownModel => StatusCode::NOT_FOUND,
            ErrorCode::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::ModelNotLoaded
            | ErrorCode::ModelLoading
            | ErrorCode::ModelUnloading
            | ErrorCode::ModelFailed => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::InvalidRequest | ErrorCode::Unsupported | ErrorCode::InvalidLoadRequest => {
                StatusCode::BAD_REQUEST
            }
            ErrorCode::InvalidRequestBody => StatusCode::UNPROCESSABLE_ENTITY,
            // The caller is gone; the status is only logged.
            ErrorCode::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

/// The snake_case code of an [`ErrorCode`].
pub fn code_str(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::UnknownModel => "unknown_model",
        ErrorCode::ModelNotLoaded => "model_not_loaded",
        ErrorCode::ModelLoading => "model_loading",
        ErrorCode::ModelUnloading => "model_unloading",
        ErrorCode::ModelFailed => "model_failed",
        ErrorCode::QueueFull => "queue_full",
        ErrorCode::InvalidRequestBody => "invalid_request_body",
        ErrorCode::InvalidLoadRequest => "invalid_load_request",
        ErrorCode::LoadFailed => "load_failed",
        ErrorCode::RuntimeCrashed => "runtime_crashed",
        ErrorCode::Cancelled => "cancelled",
        ErrorCode::InvalidRequest => "invalid_request",
        ErrorCode::Unsupported => "unsupported",
        _ => "runtime_error",
    }
}

impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> Self {
        let status = status_of(&err);
        let code = code_str(err.code());
        let mut api = ApiError::new(status, code, err.to_string());
        match &err {
            ManagerError::LoadFailed { snapshot } => {
                api = api.with("model", serde_json::to_value(snapshot).unwrap_or_default());
            }
            ManagerError::InvalidLoadSchema { field, .. } => {
                api = api.with("field", field.clone().into());
            }
            ManagerError::InvalidLoadRequest { field: Some(field), .. } => {
                api = api.with("field", field.clone().into());
            }
            ManagerError::Conflict { state, .. } => {
                api = api.with("runtime_state", state.as_str().into());
            }
            _ => {}
        }
        api
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_lifecycle::{AdmissionError, ModelState};

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
                ManagerError::Conflict { state: ModelState::Unloading, message: "m".into() },
                409,
                "model_unloading",
            ),
            (
                ManagerError::Conflict { state: ModelState::Loading, message: "m".into() },
                409,
                "model_loading",
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
            assert_eq!((api.status.as_u16(), api.code), (status, code), "{err:?}");
        }
    }
}
