//! The one code vocabulary on the wire: the runtime's [`RuntimeCode`] and the few codes the
//! HTTP layer alone produces ([`HttpCode`]), joined in [`ErrorCode`], with the one mapping
//! from a code to its HTTP status ([`ErrorCode::status`]) and what each code tells an HTTP
//! client ([`ErrorCode::description`], the text of the OpenAPI document).

use std::borrow::Cow;

use http::StatusCode;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use strum::IntoEnumIterator;

pub use hangar_runtime::ErrorCode as RuntimeCode;

/// The codes only the HTTP layer produces: routing, bodies, keys, origins and hosts, request
/// limits and a few routes' own answers. Every other code is the runtime's [`RuntimeCode`].
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum HttpCode {
    /// no route matches the request path.
    NotFound,
    /// the path exists, but not with this method (see the `Allow` header).
    MethodNotAllowed,
    /// the body exceeds `max_request_body_bytes`.
    PayloadTooLarge,
    /// the body did not arrive in full within `connections.body_read_timeout_s` of the request
    /// head; the connection is closed.
    BodyTimeout,
    /// an admin route was called without `Authorization: Bearer <admin key>`.
    Unauthorized,
    /// the admin key given is not the configured one.
    Forbidden,
    /// the multi-model unload names a model that is not loaded.
    NothingToUnload,
    /// KServe v2 model readiness of a configured model that is not ready.
    ModelNotReady,
    /// a browser request from an origin other than the server's own pages and
    /// `http.allowed_origins` (or `Origin: null`, or `Sec-Fetch-Site: cross-site`).
    OriginNotAllowed,
    /// the `Host` is not a name this listener answers (on a loopback listener: not a loopback
    /// name, an IP address or in `http.allowed_hosts`; DNS rebinding).
    HostNotAllowed,
    /// a list in the request is longer than its `limits` allow (messages, input items, embedding
    /// inputs, documents, tools, stop sequences) or a stop sequence is too long; the message names
    /// the field, its size and the limit, `field` the field. Nothing reached the engine.
    LimitExceeded,
    /// a config reload read a config with problems (`problems` lists every one); nothing
    /// changed.
    InvalidConfig,
    /// a config reload on a service whose host gave it no config to read.
    ReloadUnavailable,
    /// the connection already runs `connections.max_keyless_streams` calls without a key.
    TooManyKeylessCalls,
    /// the request bodies held at once reached `max_request_bodies_bytes`.
    RequestBodiesFull,
}

/// Every machine-readable code Hangar answers with (the `code` of the error envelope and the
/// `outcome` label of request metrics), serialized as the bare snake_case code. Each code has
/// exactly one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrorCode {
    /// A code of the control plane.
    Runtime(RuntimeCode),
    /// A code of the HTTP layer.
    Http(HttpCode),
}

impl ErrorCode {
    /// Every code: the runtime's, then the HTTP layer's.
    pub fn all() -> impl Iterator<Item = ErrorCode> {
        RuntimeCode::iter().map(Self::Runtime).chain(HttpCode::iter().map(Self::Http))
    }

    /// The snake_case code.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runtime(code) => code.as_str(),
            Self::Http(code) => code.into(),
        }
    }

    /// The one mapping from a code to its HTTP status.
    pub fn status(self) -> StatusCode {
        use HttpCode as H;
        use RuntimeCode as R;
        match self {
            Self::Runtime(code) => match code {
                R::UnknownModel | R::LeaseNotFound => StatusCode::NOT_FOUND,
                R::ModelNotLoaded
                | R::ModelLoading
                | R::ModelUnloading
                | R::ModelFailed
                | R::BackendUnavailable
                | R::AdminBusy
                | R::GenerationAborted
                | R::ModelQuarantined => StatusCode::SERVICE_UNAVAILABLE,
                R::QueueFull | R::TooManyLeases => StatusCode::TOO_MANY_REQUESTS,
                R::StateConflict | R::RequestsActive | R::SlotsPinned => StatusCode::CONFLICT,
                R::InvalidRequestBody | R::WeightsUnreadable => StatusCode::UNPROCESSABLE_ENTITY,
                R::NotImplemented => StatusCode::NOT_IMPLEMENTED,
                R::InvalidLoadRequest
                | R::LoadFailed
                | R::InvalidRequest
                | R::Unsupported
                | R::ThinkingUnsupported
                | R::ModelTypeMismatch => StatusCode::BAD_REQUEST,
                R::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                R::BackendCrashed | R::RuntimeError => StatusCode::INTERNAL_SERVER_ERROR,
                R::UpstreamError | R::UpstreamAnswerTooLarge => StatusCode::BAD_GATEWAY,
                R::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                R::WouldPause => StatusCode::METHOD_NOT_ALLOWED,
                R::InsufficientVram | R::InsufficientMemory => StatusCode::INSUFFICIENT_STORAGE,
            },
            Self::Http(code) => match code {
                H::NotFound | H::NothingToUnload => StatusCode::NOT_FOUND,
                H::ModelNotReady | H::LimitExceeded | H::InvalidConfig => StatusCode::BAD_REQUEST,
                H::ReloadUnavailable => StatusCode::NOT_IMPLEMENTED,
                H::TooManyKeylessCalls => StatusCode::TOO_MANY_REQUESTS,
                H::RequestBodiesFull => StatusCode::SERVICE_UNAVAILABLE,
                H::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
                H::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                H::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
                H::Unauthorized => StatusCode::UNAUTHORIZED,
                H::Forbidden | H::OriginNotAllowed | H::HostNotAllowed => StatusCode::FORBIDDEN,
            },
        }
    }

    /// What the code tells an HTTP client, after its status (`"404: the model is not
    /// configured."`): the OpenAPI document's description of the code.
    pub fn description(self) -> String {
        use HttpCode as H;
        use RuntimeCode as R;
        let meaning = match self {
            Self::Runtime(R::UnknownModel) => "the model is not configured.",
            Self::Runtime(R::ModelNotLoaded) => {
                "the model is unloaded; requests are admitted only while it is loaded."
            }
            Self::Runtime(R::ModelLoading) => "the model is loading.",
            Self::Runtime(R::ModelUnloading) => "the model is unloading.",
            Self::Runtime(R::ModelFailed) => {
                "the model's last load failed or its runtime crashed; see `last_error`."
            }
            Self::Runtime(R::QueueFull) => "the model's request queue is full.",
            Self::Runtime(R::StateConflict) => {
                "the model's state does not allow the operation now (unload while loading, load while unloading); `runtime_state` says which state."
            }
            Self::Runtime(R::InvalidRequestBody) => {
                "the body is not valid JSON or fails the request schema; the message carries the parser's line and column, `field` names the offending field when one is to blame."
            }
            Self::Runtime(R::InvalidLoadRequest) => {
                "load options are well-formed but wrong for the model's backend or state."
            }
            Self::Runtime(R::LoadFailed) => {
                "the load ran and failed (the model is `failed`, `last_error` says why), or a reload failed and the previous runtime keeps serving."
            }
            Self::Runtime(R::BackendCrashed) => {
                "the engine crashed (its process exited) while serving the request; the model is now `failed` and `last_error` has the exit status and last log lines."
            }
            Self::Runtime(R::Cancelled) => "the caller went away (only logged and counted).",
            Self::Runtime(R::InvalidRequest) => {
                "the request is not valid for the model or the route."
            }
            Self::Runtime(R::Unsupported) => {
                "the model's engine does not support what the request asks."
            }
            Self::Runtime(R::RuntimeError) => "the engine failed the request.",
            Self::Runtime(R::UpstreamError) => {
                "a forwarding engine (llama-server, vllm serve, a remote API) answered with an error of its own; the message carries its status and message."
            }
            Self::Runtime(R::UpstreamAnswerTooLarge) => {
                "a forwarding engine's answer was larger than `limits.max_answer_bytes`; it was cut, and nothing of it reached the client."
            }
            Self::Runtime(R::BackendUnavailable) => {
                "the engine could not be reached or did not answer in time (it is still running)."
            }
            Self::Runtime(R::ThinkingUnsupported) => {
                "the requested `thinking` mode is not one of the model's `thinking_modes`."
            }
            Self::Runtime(R::ModelTypeMismatch) => {
                "the route serves another model type (embeddings from an llm, …)."
            }
            Self::Http(H::NotFound) => "no route matches the request path.",
            Self::Http(H::InvalidConfig) => {
                "a config reload read `settings.json` + `local.json` with problems; `problems` lists every one (path and message), as `hangard config check` does. Nothing changed."
            }
            Self::Http(H::ReloadUnavailable) => {
                "the service was given no config to re-read (a host that embeds it without files)."
            }
            Self::Http(H::MethodNotAllowed) => {
                "the path exists, but not with this method (see the `Allow` header)."
            }
            Self::Http(H::PayloadTooLarge) => "the body exceeds `max_request_body_bytes`.",
            Self::Http(H::TooManyKeylessCalls) => {
                "keys are set and this connection already runs `connections.max_keyless_streams` calls without one; nothing of the body was read. Send a key, or retry after `Retry-After` seconds."
            }
            Self::Http(H::RequestBodiesFull) => {
                "the request bodies held at once, all requests together, reached `max_request_bodies_bytes`; nothing was done. Retry after `Retry-After` seconds."
            }
            Self::Http(H::BodyTimeout) => {
                "the body did not arrive in full within `connections.body_read_timeout_s` of the request head; the connection is closed."
            }
            Self::Http(H::Unauthorized) => {
                "an admin route was called without `Authorization: Bearer <admin key>`."
            }
            Self::Http(H::Forbidden) => "the admin key given is not the configured one.",
            Self::Http(H::NothingToUnload) => {
                "the multi-model unload names a model that is not loaded."
            }
            Self::Http(H::ModelNotReady) => {
                "KServe v2 model readiness of a configured model that is not ready."
            }
            Self::Runtime(R::AdminBusy) => {
                "another admin operation on the model (load, unload, …) held it for longer than `admin_lock_timeout_s`; nothing was done."
            }
            Self::Runtime(R::GenerationAborted) => {
                "an operator aborted the request (a pause with mode `abort`, a weight update with `abort_all_requests`); retry once the model continues."
            }
            Self::Runtime(R::RequestsActive) => {
                "a weight update while requests run, without `abort_all_requests` and without a `retract` pause; nothing was done."
            }
            Self::Runtime(R::WeightsUnreadable) => {
                "the weights checker could not read or parse the model's weights, or `compare` found no snapshot."
            }
            Self::Runtime(R::NotImplemented) => {
                "an operation Hangar deliberately does not perform (tensor and distributed weight updates, `reset_tensors`); the message says what to use instead."
            }
            Self::Runtime(R::LeaseNotFound) => {
                "the model has no live lease of that id (released or expired)."
            }
            Self::Runtime(R::SlotsPinned) => {
                "the load could only proceed by evicting pinned or leased models (named in the message); nothing was evicted."
            }
            Self::Runtime(R::ModelQuarantined) => {
                "the model failed to load or crashed too often and is quarantined; `retry_after` (and the `Retry-After` header) says when a request may load it again. An explicit load lifts the quarantine."
            }
            Self::Runtime(R::InsufficientVram) => {
                "the model does not fit in the VRAM budget even after evicting every model that may be evicted; `vram_shortfall` says how much is missing and which models hold the memory. Nothing was evicted."
            }
            Self::Runtime(R::InsufficientMemory) => {
                "a model on the CPU does not fit in the host-memory budget (`ram_budget`) even after evicting every CPU model that may be evicted; `memory_shortfall` says how much is missing and which models hold the memory. Nothing was evicted."
            }
            Self::Http(H::OriginNotAllowed) => {
                "a browser request from an origin other than the server's own pages and `http.allowed_origins` (or `Origin: null`, or `Sec-Fetch-Site: cross-site`)."
            }
            Self::Http(H::HostNotAllowed) => {
                "the `Host` is not a name this listener answers (on a loopback listener: not a loopback name, an IP address or in `http.allowed_hosts`; DNS rebinding)."
            }
            Self::Runtime(R::WouldPause) => {
                "`GET /weights_checker` would pause the loaded model (a checksum or compare while it serves); a `GET` changes nothing, so use `POST`."
            }
            Self::Http(H::LimitExceeded) => {
                "a list in the request is longer than its `limits` allow (messages, input items, embedding inputs, documents, tools, stop sequences) or a stop sequence is too long; the message names the field, its size and the limit, `field` the field. Nothing reached the engine."
            }
            Self::Runtime(R::DeadlineExceeded) => {
                "the request ran past `limits.request_timeout_s` and was cancelled, its slot freed. A stream that had started ends with this error as its last event instead."
            }
            Self::Runtime(R::TooManyLeases) => {
                "the model already has `limits.max_leases_per_model` live leases; nothing was done. Retry once a lease is released or expires."
            }
        };
        format!("{}: {meaning}", self.status().as_u16())
    }
}

impl From<RuntimeCode> for ErrorCode {
    fn from(code: RuntimeCode) -> Self {
        Self::Runtime(code)
    }
}

impl From<HttpCode> for ErrorCode {
    fn from(code: HttpCode) -> Self {
        Self::Http(code)
    }
}

impl PartialEq<RuntimeCode> for ErrorCode {
    fn eq(&self, other: &RuntimeCode) -> bool {
        *self == Self::Runtime(*other)
    }
}

impl PartialEq<HttpCode> for ErrorCode {
    fn eq(&self, other: &HttpCode) -> bool {
        *self == Self::Http(*other)
    }
}

impl JsonSchema for ErrorCode {
    fn schema_name() -> Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let codes: Vec<serde_json::Value> = Self::all()
            .map(|code| {
                serde_json::json!({
                    "type": "string",
                    "const": code.as_str(),
                    "description": code.description(),
                })
            })
            .collect();
        json_schema!({
            "description": "Every machine-readable error code Hangar answers with: the `code` of the error envelope and the `outcome` label of request metrics. Each code has exactly one HTTP status.",
            "oneOf": codes
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_layer_adds_codes_and_repeats_none() {
        let runtime: Vec<&str> = RuntimeCode::iter().map(RuntimeCode::as_str).collect();
        for code in HttpCode::iter() {
            let name: &str = code.into();
            assert!(!runtime.contains(&name), "{name} is the runtime's code already");
        }
    }

    #[test]
    fn serde_and_strum_agree_on_names_both_ways() {
        for code in ErrorCode::all() {
            let value = serde_json::to_value(code).unwrap();
            assert_eq!(value, code.as_str());
            assert_eq!(serde_json::from_value::<ErrorCode>(value).unwrap(), code);
            assert!(code.description().len() > 10, "{code:?}");
        }
        assert!(serde_json::from_value::<ErrorCode>("no_such_code".into()).is_err());
    }
}
