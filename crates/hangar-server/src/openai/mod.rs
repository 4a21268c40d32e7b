//! OpenAI-compatible inference routes: chat completions, completions, the Responses API,
//! embeddings, rerank, and the model list — one module per endpoint, with the shared
//! sampling parameters, message shapes and the stream encoder next to them.
//!
//! Every inference request goes through the same steps: check its lists against `limits`
//! (400 `limit_exceeded`, `limits.rs`), parse into the endpoint's typed body (422 with the
//! parser's position), name a configured model (400 without one, 404
//! `unknown_model`), check what serde cannot (400 `invalid_request`), admit it with
//! [`hangar_runtime::Manager::admit`] (which checks the work against the model's type and
//! capabilities before any auto-load: 400 `model_type_mismatch` / `thinking_unsupported`;
//! then 503 with the state's code or 429 `queue_full`), run it on the admitted guard, and
//! encode the typed answer. Streams are answered only once the generation produced its
//! first event (`stream.rs`), so failures before any output are plain JSON errors.
//!
//! Every inference request is recorded in the request metrics by endpoint, model (or
//! `_unknown` for names not in config) and outcome (`ok` or the error code); streams are
//! recorded when they end.

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod embeddings;
pub(crate) mod forward;
mod forward_rules;
pub(crate) mod limits;
mod messages;
pub(crate) mod models;
pub(crate) mod rerank;
pub(crate) mod responses;
mod responses_stream;
pub(crate) mod sampling;
pub(crate) mod stream;

pub(crate) use responses_stream::ResponseEvent;
pub(crate) use stream::data_event;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hangar_runtime::engine::GenerateSummary;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::body::Response;
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::{AppState, GenerationStats};

/// The metrics label of requests for models that are not in config.
const UNKNOWN_MODEL_LABEL: &str = "_unknown";

/// Defines a string constant type: an enum of one value, serialized as that string (the
/// `object` fields of OpenAI's answers).
macro_rules! constant {
    ($(#[$doc:meta])* $name:ident = $value:literal) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, Default, PartialEq, Eq,
            serde::Serialize, serde::Deserialize, schemars::JsonSchema,
        )]
        pub(crate) enum $name {
            #[doc = concat!("`", $value, "`")]
            #[default]
            #[serde(rename = $value)]
            Value,
        }
    };
}
pub(crate) use constant;

/// Token usage of a chat completion or completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Usage {
    /// Tokens in the prompt.
    pub(crate) prompt_tokens: u32,
    /// Tokens generated.
    pub(crate) completion_tokens: u32,
    /// Both.
    pub(crate) total_tokens: u32,
    /// How the prompt tokens were served.
    pub(crate) prompt_tokens_details: PromptTokensDetails,
}

/// Prompt tokens served from the engine's prompt cache (OpenAI's `prompt_tokens_details`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct PromptTokensDetails {
    /// Prompt tokens reused from an earlier request's KV cache, not decoded again.
    pub(crate) cached_tokens: u32,
}

impl Usage {
    pub(crate) fn of(summary: &GenerateSummary) -> Self {
        Self {
            prompt_tokens: summary.prompt_tokens,
            completion_tokens: summary.completion_tokens,
            total_tokens: summary.prompt_tokens.saturating_add(summary.completion_tokens),
            prompt_tokens_details: PromptTokensDetails { cached_tokens: summary.cached_tokens },
        }
    }
}

/// Token usage of embeddings and rerank requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct PromptUsage {
    /// Tokens consumed.
    pub(crate) prompt_tokens: u32,
    /// The same: nothing is generated.
    pub(crate) total_tokens: u32,
}

impl PromptUsage {
    pub(crate) fn of(prompt_tokens: u32) -> Self {
        Self { prompt_tokens, total_tokens: prompt_tokens }
    }
}

/// What a handler produced: a complete response, or a stream that records its own metrics
/// when it ends.
pub(crate) enum Reply {
    Done(Response),
    Streaming(Response),
}

/// Records one inference request in the request metrics.
#[derive(Clone)]
pub(crate) struct Recorder {
    state: Arc<AppState>,
    endpoint: Endpoint,
    model: String,
    start: Instant,
}

impl Recorder {
    pub(crate) fn new(state: &Arc<AppState>, endpoint: Endpoint) -> Self {
        Self {
            state: Arc::clone(state),
            endpoint,
            model: UNKNOWN_MODEL_LABEL.to_owned(),
            start: Instant::now(),
        }
    }

    /// The request's model: present (else 400) and configured (else 404); labels the
    /// request's metrics with it.
    ///
    /// # Errors
    /// 400 `invalid_request` without a model, 404 `unknown_model` for an unknown one.
    pub(crate) fn model(&mut self, model: Option<String>) -> Result<String, ApiError> {
        let model = model.ok_or_else(|| ApiError::bad_request("`model` is required"))?;
        // An alias is served as the model it names; metrics count the model.
        let Some(name) = self.state.manager.canonical(&model) else {
            return Err(hangar_runtime::ManagerError::from(
                hangar_runtime::AdmissionError::UnknownModel { model },
            )
            .into());
        };
        name.as_str().clone_into(&mut self.model);
        Ok(model)
    }

    pub(crate) fn model_label(&self) -> &str {
        &self.model
    }

    pub(crate) fn record(&self, outcome: &str) {
        self.state.metrics.record(self.endpoint, &self.model, outcome, self.start.elapsed());
    }

    /// Keeps the statistics of a finished generation for `GET /api/v1/stats`.
    pub(crate) fn generation(
        &self,
        summary: &GenerateSummary,
        start: Instant,
        first: Option<Instant>,
    ) {
        let now = Instant::now();
        let decode_tokens = summary.completion_tokens.saturating_sub(1);
        let tokens_per_second = first.and_then(|f| {
            let secs = now.duration_since(f).as_secs_f64();
            (decode_tokens > 0 && secs > 0.0).then(|| f64::from(decode_tokens) / secs)
        });
        let stats = GenerationStats {
            model: self.model.clone(),
            endpoint: self.endpoint,
            time_to_first_token: first.map(|f| f.duration_since(start).as_secs_f64()),
            tokens_per_second,
            input_tokens: summary.prompt_tokens,
            output_tokens: summary.completion_tokens,
            finished_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        *self.state.last_generation.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
    }

    /// Records a request that ended now (streams record themselves) and passes it on.
    pub(crate) fn finish(self, reply: Result<Reply, ApiError>) -> Result<Response, ApiError> {
        match reply {
            Ok(Reply::Done(response)) => {
                self.record("ok");
                Ok(response)
            }
            Ok(Reply::Streaming(response)) => Ok(response),
            Err(e) => {
                self.record(e.code.as_str());
                Err(e)
            }
        }
    }
}

/// A value's JSON kind, and its first element's for arrays ("an array of a number").
pub(crate) fn shape(value: &serde_json::Value) -> String {
    match value.as_array().and_then(|a| a.first()) {
        Some(first) => format!("an array of {}", hangar_config::json_kind(first)),
        None => hangar_config::json_kind(value).to_owned(),
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A unique id with `prefix`: the current time and a process-wide counter, in hex.
pub(crate) fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}{:012x}{n:06x}", nanos as u64 & 0xffff_ffff_ffff)
}
