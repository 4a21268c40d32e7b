//! gRPC status codes from Hangar's errors, and gRPC parameters as JSON values.
//!
//! The message is the HTTP answer's message. Every status also carries the machine-readable
//! code as `hangar-error-code` metadata, and `retry-after` (seconds) when the error has one.

use std::collections::HashMap;

use serde_json::{Map, Value};
use tonic::{Code, Status};

use super::proto::ModelRepositoryParameter;
use super::proto::model_repository_parameter::ParameterChoice;
use crate::error::{ApiError, ErrorCode, HttpCode, RuntimeCode};

/// The gRPC code of an error code: one place, exhaustive, so a new code needs a decision.
pub(crate) fn grpc_code(code: ErrorCode) -> Code {
    use HttpCode as H;
    use RuntimeCode as R;
    match code {
        ErrorCode::Runtime(code) => match code {
            R::UnknownModel | R::LeaseNotFound => Code::NotFound,
            R::InvalidRequestBody
            | R::InvalidLoadRequest
            | R::InvalidRequest
            | R::Unsupported
            | R::ThinkingUnsupported
            | R::ModelTypeMismatch
            | R::WeightsUnreadable => Code::InvalidArgument,
            R::StateConflict | R::RequestsActive | R::SlotsPinned => Code::FailedPrecondition,
            R::ModelNotLoaded
            | R::ModelLoading
            | R::ModelUnloading
            | R::ModelFailed
            | R::BackendUnavailable
            | R::UpstreamError
            | R::UpstreamAnswerTooLarge
            | R::AdminBusy
            | R::GenerationAborted
            | R::ModelQuarantined => Code::Unavailable,
            R::QueueFull | R::TooManyLeases | R::InsufficientVram | R::InsufficientMemory => {
                Code::ResourceExhausted
            }
            R::DeadlineExceeded => Code::DeadlineExceeded,
            // Triton answers a failed load with INTERNAL too.
            R::LoadFailed | R::BackendCrashed | R::RuntimeError => Code::Internal,
            R::NotImplemented | R::WouldPause => Code::Unimplemented,
            R::Cancelled => Code::Cancelled,
        },
        ErrorCode::Http(code) => match code {
            H::NotFound | H::NothingToUnload => Code::NotFound,
            H::ModelNotReady | H::LimitExceeded | H::InvalidConfig => Code::InvalidArgument,
            H::PayloadTooLarge | H::TooManyKeylessCalls => Code::ResourceExhausted,
            H::RequestBodiesFull => Code::Unavailable,
            H::MethodNotAllowed | H::ReloadUnavailable => Code::Unimplemented,
            H::Unauthorized => Code::Unauthenticated,
            H::Forbidden | H::OriginNotAllowed | H::HostNotAllowed => Code::PermissionDenied,
            H::BodyTimeout => Code::DeadlineExceeded,
        },
    }
}

/// The status of an error: its gRPC code, the HTTP message, and the code and retry delay as
/// metadata.
pub(crate) fn status(error: ApiError) -> Status {
    let mut status = Status::new(grpc_code(error.code), error.message);
    let metadata = status.metadata_mut();
    if let Ok(code) = error.code.as_str().parse() {
        metadata.insert("hangar-error-code", code);
    }
    if let Some(seconds) = error.retry_after {
        metadata.insert("retry-after", seconds.into());
    }
    status
}

/// gRPC's `parameters` as the JSON map the HTTP body would carry: booleans, integers and
/// strings as themselves; bytes as a string when they are UTF-8 (a `config` sent as bytes),
/// else as an array of numbers (refused as the wrong type where a value is read).
pub(crate) fn parameters(
    parameters: HashMap<String, ModelRepositoryParameter>,
) -> Map<String, Value> {
    let mut sorted: Vec<_> = parameters.into_iter().collect();
    // Deterministic order, so the first offending parameter named is always the same.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
        .into_iter()
        .map(|(key, p)| {
            let value = match p.parameter_choice {
                None => Value::Null,
                Some(ParameterChoice::BoolParam(b)) => Value::Bool(b),
                Some(ParameterChoice::Int64Param(i)) => Value::from(i),
                Some(ParameterChoice::StringParam(s)) => Value::String(s),
                Some(ParameterChoice::BytesParam(bytes)) => match String::from_utf8(bytes) {
                    Ok(text) => Value::String(text),
                    Err(e) => Value::from(e.into_bytes()),
                },
            };
            (key, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_keeps_its_meaning_over_grpc() {
        for code in ErrorCode::all() {
            let grpc = grpc_code(code);
            // The HTTP status class and the gRPC code agree on who is at fault.
            let expected: &[Code] = match code.status().as_u16() {
                404 => &[Code::NotFound],
                400 | 422 => &[Code::InvalidArgument, Code::Internal],
                409 => &[Code::FailedPrecondition],
                503 | 502 => &[Code::Unavailable],
                429 | 413 | 507 => &[Code::ResourceExhausted],
                500 => &[Code::Internal],
                501 | 405 => &[Code::Unimplemented],
                401 => &[Code::Unauthenticated],
                403 => &[Code::PermissionDenied],
                499 => &[Code::Cancelled],
                504 => &[Code::DeadlineExceeded],
                408 => &[Code::DeadlineExceeded],
                other => panic!("{code:?}: status {other} has no gRPC code here"),
            };
            assert!(expected.contains(&grpc), "{code:?} → {grpc:?}");
        }
        assert_eq!(grpc_code(RuntimeCode::LoadFailed.into()), Code::Internal);
    }

    #[test]
    fn a_status_carries_the_message_code_and_retry_delay() {
        let mut error = ApiError::new(RuntimeCode::ModelQuarantined, "model 'm' is quarantined");
        error.retry_after = Some(30);
        let status = status(error);
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, "model 'm' is quarantined")
        );
        assert_eq!(status.metadata().get("hangar-error-code").unwrap(), "model_quarantined");
        assert_eq!(status.metadata().get("retry-after").unwrap(), "30");
    }

    #[test]
    fn parameters_read_as_json_values() {
        let p = |c| ModelRepositoryParameter { parameter_choice: Some(c) };
        let map = parameters(HashMap::from([
            ("config".to_owned(), p(ParameterChoice::StringParam("{}".into()))),
            ("flag".to_owned(), p(ParameterChoice::BoolParam(true))),
            ("n".to_owned(), p(ParameterChoice::Int64Param(-3))),
            ("text".to_owned(), p(ParameterChoice::BytesParam(b"{\"a\":1}".to_vec()))),
            ("blob".to_owned(), p(ParameterChoice::BytesParam(vec![0xff, 1]))),
        ]));
        assert_eq!(
            Value::Object(map),
            serde_json::json!({ "blob": [255, 1], "config": "{}", "flag": true, "n": -3, "text": "{\"a\":1}" })
        );
    }
}
