//! The manager's error type and the one list of machine-readable error codes.

use hangar_backend::{OverrideError, RuntimeError};
use hangar_lifecycle::{AdmissionError, ModelState};
use schemars::JsonSchema;
use serde::Serialize;

use crate::snapshot::ModelSnapshot;

/// Why a manager operation did not do what was asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The request was not admitted to the model (unknown, not loaded, loading, unloading,
    /// failed, queue full).
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The model's state does not allow the operation now (load while unloading, unload
    /// while loading, options for a model that is already loading).
    #[error("{message}")]
    Conflict {
        /// The model's state.
        state: ModelState,
        /// What conflicts.
        message: String,
    },
    /// Load options that fail the request schema (wrong type, non-positive integer,
    /// unknown field).
    #[error("{field}: {message}")]
    InvalidLoadSchema {
        /// The offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Load options that are well-formed but wrong for this model's backend or state.
    #[error("{}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    InvalidLoadRequest {
        /// The offending field, when one is to blame.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The load ran and failed; the model is now `failed` and the snapshot says why.
    #[error("{}", load_failed_message(snapshot.last_error.as_deref()))]
    LoadFailed {
        /// The model after the failed load.
        snapshot: Box<ModelSnapshot>,
    },
    /// The request reached a runtime and failed there.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// "load failed: <reason>", without doubling the prefix the backend's reason may carry.
fn load_failed_message(last_error: Option<&str>) -> String {
    let reason = last_error.unwrap_or("unknown error");
    if reason.starts_with("load failed") {
        reason.to_owned()
    } else {
        format!("load failed: {reason}")
    }
}

impl From<OverrideError> for ManagerError {
    fn from(e: OverrideError) -> Self {
        match e {
            OverrideError::Schema { field, message } => Self::InvalidLoadSchema { field, message },
            OverrideError::Invalid { field, message } => {
                Self::InvalidLoadRequest { field, message }
            }
            other => Self::InvalidLoadRequest { field: None, message: other.to_string() },
        }
    }
}

/// Every machine-readable error code Hangar's control plane produces: the JSON `code` of
/// error responses and the `outcome` label of metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// No such model in config.
    UnknownModel,
    /// The model is unloaded.
    ModelNotLoaded,
    /// The model is loading.
    ModelLoading,
    /// The model is unloading.
    ModelUnloading,
    /// The model's last load failed or its runtime crashed.
    ModelFailed,
    /// The model's request queue is full.
    QueueFull,
    /// Load options fail the request schema.
    InvalidRequestBody,
    /// Load options are wrong for the model's backend or state.
    InvalidLoadRequest,
    /// The load ran and failed.
    LoadFailed,
    /// The runtime crashed while serving the request.
    RuntimeCrashed,
    /// The request was cancelled by its caller.
    Cancelled,
    /// The request is not valid for the model.
    InvalidRequest,
    /// The model does not support the operation.
    Unsupported,
    /// The engine failed the request.
    RuntimeError,
}

impl ManagerError {
    /// This error's code.
    pub fn code(&self) -> ErrorCode {
        use hangar_backend::RuntimeErrorCode as R;
        use hangar_lifecycle::AdmissionCode as A;
        match self {
            Self::Admission(e) => match e.code() {
                A::UnknownModel => ErrorCode::UnknownModel,
                A::ModelNotLoaded => ErrorCode::ModelNotLoaded,
                A::ModelLoading => ErrorCode::ModelLoading,
                A::ModelUnloading => ErrorCode::ModelUnloading,
                A::ModelFailed => ErrorCode::ModelFailed,
                A::QueueFull => ErrorCode::QueueFull,
            },
            Self::Conflict { state: ModelState::Unloading, .. } => ErrorCode::ModelUnloading,
            Self::Conflict { .. } => ErrorCode::ModelLoading,
            Self::InvalidLoadSchema { .. } => ErrorCode::InvalidRequestBody,
            Self::InvalidLoadRequest { .. } => ErrorCode::InvalidLoadRequest,
            Self::LoadFailed { .. } => ErrorCode::LoadFailed,
            Self::Runtime(e) => match e.code() {
                R::RuntimeCrashed => ErrorCode::RuntimeCrashed,
                R::Cancelled => ErrorCode::Cancelled,
                R::InvalidRequest => ErrorCode::InvalidRequest,
                R::Unsupported => ErrorCode::Unsupported,
                R::RuntimeError => ErrorCode::RuntimeError,
            },
        }
    }
}
