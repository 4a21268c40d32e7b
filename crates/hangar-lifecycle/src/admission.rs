//! Admission: whether a request may reach a model, and the machine-readable reason when not.

use crate::state::ModelState;

/// Why a request was not admitted to a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// No model of that name is configured.
    #[error("unknown model `{model}`")]
    UnknownModel {
        /// The name asked for.
        model: String,
    },
    /// The model is configured but not loaded.
    #[error("model is not loaded; load it first")]
    ModelNotLoaded,
    /// The model is loading.
    #[error("model is loading; retry when it is loaded")]
    ModelLoading,
    /// The model is unloading (or began unloading while the request waited in its queue).
    #[error("model is unloading")]
    ModelUnloading,
    /// The model's last load failed or its runtime crashed.
    #[error("model failed: {last_error}")]
    ModelFailed {
        /// The model's `last_error`.
        last_error: String,
    },
    /// The model's request queue is full.
    #[error("model queue is full ({depth} requests waiting)")]
    QueueFull {
        /// The queue bound that was reached.
        depth: usize,
    },
    /// An operator paused the model with `mode: abort` (or aborted requests for a weight
    /// update) while the request was queued or running.
    #[error("generation aborted: {reason}")]
    GenerationAborted {
        /// Why, as the operator's action says it.
        reason: String,
    },
}

/// Whether a model in `state` admits inference requests (only `loaded` does).
///
/// # Errors
/// The spec's code for every other state; `last_error` fills `model_failed`'s message.
pub fn admit(state: ModelState, last_error: Option<&str>) -> Result<(), AdmissionError> {
    match state {
        ModelState::Loaded => Ok(()),
        ModelState::Unloaded => Err(AdmissionError::ModelNotLoaded),
        ModelState::Loading => Err(AdmissionError::ModelLoading),
        ModelState::Unloading => Err(AdmissionError::ModelUnloading),
        ModelState::Failed => Err(AdmissionError::ModelFailed {
            last_error: last_error.unwrap_or("unknown error").to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loaded_models_admit_requests() {
        let cases = [
            (ModelState::Loaded, None),
            (ModelState::Unloaded, Some(AdmissionError::ModelNotLoaded)),
            (ModelState::Loading, Some(AdmissionError::ModelLoading)),
            (ModelState::Unloading, Some(AdmissionError::ModelUnloading)),
            (ModelState::Failed, Some(AdmissionError::ModelFailed { last_error: "boom".into() })),
        ];
        for (state, want) in cases {
            assert_eq!(admit(state, Some("boom")).err(), want, "{state}");
        }
    }

    #[test]
    fn failed_admission_carries_last_error() {
        let err = admit(ModelState::Failed, Some("CUDA out of memory")).unwrap_err();
        assert_eq!(err, AdmissionError::ModelFailed { last_error: "CUDA out of memory".into() });
        assert_eq!(err.to_string(), "model failed: CUDA out of memory");
    }
}
