//! The route table (data: also the source of the OpenAPI document) and path matching.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use schemars::{Schema, SchemaGenerator};

use crate::body::Response;
use crate::error::ApiError;
use crate::state::AppState;
use crate::{admin, health, kserve, multi_model, openai, openapi};

/// What a handler gets.
pub(crate) struct Ctx {
    pub(crate) state: Arc<AppState>,
    /// Path parameters, percent-decoded, in order.
    pub(crate) params: Vec<String>,
    pub(crate) body: Bytes,
}

impl Ctx {
    /// The first path parameter (`{name}`).
    pub(crate) fn name(&self) -> &str {
        self.params.first().map_or("", String::as_str)
    }
}

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;
pub(crate) type Handler = fn(Ctx) -> HandlerFuture;
pub(crate) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The API group a route belongs to (an OpenAPI tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    Admin,
    Inference,
    MultiModel,
    Repository,
    Operations,
}

impl Group {
    pub(crate) const fn tag(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Inference => "inference",
            Self::MultiModel => "multi-model",
            Self::Repository => "model-repository",
            Self::Operations => "operations",
        }
    }
}

/// One route: how it is matched, who may call it, what it is, and its handler.
pub(crate) struct Route {
    pub(crate) method: Method,
    /// Path with `{param}` segments.
    pub(crate) path: &'static str,
    pub(crate) group: Group,
    /// Requires the admin bearer key when one is configured.
    pub(crate) admin: bool,
    pub(crate) summary: &'static str,
    pub(crate) description: &'static str,
    /// Schema of the JSON request body, if it takes one.
    pub(crate) request: Option<SchemaFn>,
    /// Schema of the JSON success body.
    pub(crate) response: Option<SchemaFn>,
    pub(crate) handler: Handler,
}

/// Wraps an `async fn(Ctx) -> Result<Response, ApiError>` with the standard envelope.
macro_rules! api {
    ($f:path) => {
        |ctx| Box::pin(async move { $f(ctx).await.unwrap_or_else(ApiError::into_response) })
    };
}

/// Wraps an `async fn(Ctx) -> Result<Response, ApiError>` with the KServe v2 envelope.
macro_rules! v2 {
    ($f:path) => {
        |ctx| Box::pin(async move { $f(ctx).await.unwrap_or_else(ApiError::into_v2_response) })
    };
}

macro_rules! schema {
    ($t:ty) => {
        Some(|g: &mut SchemaGenerator| g.subschema_for::<$t>())
    };
}

/// Every route of the service.
pub(crate) fn routes() -> &'static [Route] {
    &ROUTES
}

static ROUTES: std::sync::LazyLock<Vec<Route>> = std::sync::LazyLock::new(|| {
    use Group::*;
    let r =
        |method: Method, path, group, admin, summary, description, request, response, handler| {
            Route { method, path, group, admin, summary, description, request, response, handler }
        };
    vec![
        // Admin: runtime-admin-api.md
        r(
            Method::GET,
            "/v1/admin/models",
            Admin,
            true,
            "List models with their live state",
            "Every model of the merged config with its live runtime state, replica and in-flight counts, VRAM estimate, load constraints and recommendations, active load override, capabilities and configured definition. The main UI source of truth.",
            None,
            schema!(admin::ModelsResponse),
            api!(admin::list),
        ),
        r(
            Method::GET,
            "/v1/admin/models/{name}",
            Admin,
            true,
            "One model with its live state",
            "The same row as in the list, for one model. 404 unknown_model for a name not in config.",
            None,
            schema!(hangar_runtime::ModelSnapshot),
            api!(admin::show),
        ),
        r(
            Method::POST,
            "/v1/admin/models/{name}/load",
            Admin,
            true,
            "Load a configured model",
            "Loads a model of the merged config and answers when it is loaded or failed. Optional body: `replicas` and backend-specific runtime-only overrides (see the model's load_constraints). 200 when already loaded or loading (without options); 400 invalid_load_request for values wrong for the backend or options sent to a loaded model; 422 for bodies that fail the schema; 409 while the model is unloading; 500 load_failed when the load ran and failed.",
            schema!(admin::LoadBody),
            schema!(hangar_runtime::ModelSnapshot),
            api!(admin::load),
        ),
        r(
            Method::POST,
            "/v1/admin/models/{name}/unload",
            Admin,
            true,
            "Gracefully unload a model",
            "Stops admissions, cancels queued requests with model_unloading, lets running requests finish, releases the runtimes, then answers. 200 when already unloaded or unloading; 409 while loading.",
            None,
            schema!(hangar_runtime::ModelSnapshot),
            api!(admin::unload),
        ),
        r(
            Method::GET,
            "/v1/admin/gpu-memory",
            Admin,
            true,
            "GPU memory and per-model VRAM estimates",
            "GPU memory per device (empty with an error string when no telemetry is available) and every model's VRAM estimate.",
            None,
            schema!(admin::GpuMemoryResponse),
            api!(admin::gpu_memory),
        ),
        // Inference: OpenAI-compatible
        r(
            Method::POST,
            "/v1/chat/completions",
            Inference,
            false,
            "Chat completion",
            "OpenAI-compatible chat completion; `stream: true` answers with server-sent events in OpenAI's chunk format ending with `[DONE]`. Requests are admitted only while the model is loaded (or auto-loaded), else 503 with the state's code.",
            schema!(openai::ChatCompletionRequest),
            None,
            api!(openai::chat_completions),
        ),
        r(
            Method::POST,
            "/v1/completions",
            Inference,
            false,
            "Text completion",
            "OpenAI-compatible completion of a raw prompt; streams with `stream: true`.",
            schema!(openai::CompletionRequest),
            None,
            api!(openai::completions),
        ),
        r(
            Method::POST,
            "/v1/responses",
            Inference,
            false,
            "Response (OpenAI Responses API)",
            "Generates a response from `input` (a string or messages). `thinking` (default/enabled/disabled) must be one of the model's capabilities.thinking_modes, else 400 thinking_unsupported. TranslateGemma models take `source_lang_code` / `target_lang_code`.",
            schema!(openai::ResponsesRequest),
            None,
            api!(openai::responses),
        ),
        r(
            Method::POST,
            "/v1/embeddings",
            Inference,
            false,
            "Embeddings",
            "OpenAI-compatible embeddings for a string or a list of strings, for models of type embedding.",
            schema!(openai::EmbeddingsRequest),
            None,
            api!(openai::embeddings),
        ),
        r(
            Method::POST,
            "/v1/rerank",
            Inference,
            false,
            "Rerank documents",
            "Scores `documents` against `query` with a reranking model; results sorted by relevance with their original index.",
            schema!(openai::RerankBody),
            None,
            api!(openai::rerank),
        ),
        r(
            Method::GET,
            "/v1/models",
            Inference,
            false,
            "List models (OpenAI format)",
            "Every configured model in OpenAI's list format, with its runtime state.",
            None,
            None,
            api!(openai::list_models),
        ),
        r(
            Method::GET,
            "/v1/models/{name}",
            Inference,
            false,
            "One model (OpenAI format)",
            "One configured model in OpenAI's model format.",
            None,
            None,
            api!(openai::get_model),
        ),
        // Multi-model: multi-model.md
        r(
            Method::GET,
            "/api/v1/health",
            MultiModel,
            false,
            "Health with every loaded model",
            "Server health; `model_loaded` / `checkpoint_loaded` refer to the most recently loaded model; `all_models_loaded` lists every loaded model with its checkpoint, last use, type, device and backend URL.",
            None,
            None,
            api!(multi_model::health),
        ),
        r(
            Method::GET,
            "/api/v1/stats",
            MultiModel,
            false,
            "Stats of the most recent request",
            "Statistics of the most recent inference request.",
            None,
            None,
            api!(multi_model::stats),
        ),
        r(
            Method::POST,
            "/api/v1/load",
            MultiModel,
            true,
            "Load a model (Lemonade-style)",
            "Loads `model_name`, evicting the least recently used model of its type when its slots are full. `ctx_size` maps to the backend's context field; `llamacpp_args` and `llamacpp_backend` apply to llama_server models only.",
            schema!(multi_model::LoadBody),
            None,
            api!(multi_model::load),
        ),
        r(
            Method::POST,
            "/api/v1/unload",
            MultiModel,
            true,
            "Unload one model, or all",
            "Unloads `model_name` (404 if it is not loaded), or every loaded model when no name is given.",
            schema!(multi_model::UnloadBody),
            None,
            api!(multi_model::unload),
        ),
        // Model repository: KServe v2 / Triton
        r(
            Method::GET,
            "/v2",
            Repository,
            false,
            "Server metadata (KServe v2)",
            "Server name, version and extensions, as KServe v2 clients expect.",
            None,
            None,
            v2!(kserve::server_metadata),
        ),
        r(
            Method::GET,
            "/v2/health/live",
            Repository,
            false,
            "Liveness (KServe v2)",
            "200 while the process is up.",
            None,
            None,
            v2!(kserve::live),
        ),
        r(
            Method::GET,
            "/v2/health/ready",
            Repository,
            false,
            "Readiness (KServe v2)",
            "200 when every enabled model is loaded, else 503.",
            None,
            None,
            v2!(kserve::ready),
        ),
        r(
            Method::GET,
            "/v2/models/{name}/ready",
            Repository,
            false,
            "Model readiness (KServe v2)",
            "200 when the model is loaded, else 400/404 as Triton answers.",
            None,
            None,
            v2!(kserve::model_ready),
        ),
        r(
            Method::POST,
            "/v2/repository/index",
            Repository,
            true,
            "Repository index",
            "Every model with its state (READY, LOADING, UNLOADING, UNAVAILABLE with a reason). `ready: true` lists only ready models.",
            schema!(kserve::IndexBody),
            None,
            v2!(kserve::index),
        ),
        r(
            Method::POST,
            "/v2/repository/models/{name}/load",
            Repository,
            true,
            "Load or reload a model",
            "Loads the model. Already loaded without parameters: no-op. With `parameters.config` (a JSON object or a JSON string): unload and load again with that config as the override patch. `file:` parameters are refused.",
            schema!(kserve::LoadBody),
            None,
            v2!(kserve::load),
        ),
        r(
            Method::POST,
            "/v2/repository/models/{name}/unload",
            Repository,
            true,
            "Unload a model",
            "Gracefully unloads the model; `parameters.unload_dependents` is accepted (models have no dependents).",
            schema!(kserve::UnloadBody),
            None,
            v2!(kserve::unload),
        ),
        // Operations
        r(
            Method::GET,
            "/metrics",
            Operations,
            false,
            "Prometheus metrics",
            "Per-model state, in-flight and queue gauges, request counts and latency histograms by model and outcome, load / unload / eviction / crash counters.",
            None,
            None,
            api!(health::metrics),
        ),
        r(
            Method::GET,
            "/openapi.json",
            Operations,
            false,
            "This document",
            "The OpenAPI 3.1 document of the service, generated from the same types the handlers use.",
            None,
            None,
            api!(openapi::document),
        ),
        r(
            Method::GET,
            "/healthz",
            Operations,
            false,
            "Liveness",
            "200 while the process is up.",
            None,
            None,
            api!(health::healthz),
        ),
        r(
            Method::GET,
            "/readyz",
            Operations,
            false,
            "Readiness",
            "200 when every model with `enabled: true` is loaded, else 503 listing the ones that are not.",
            None,
            None,
            api!(health::readyz),
        ),
    ]
});

/// The outcome of matching a request against the table.
pub(crate) enum Match<'a> {
    Found(&'a Route, Vec<String>),
    MethodNotAllowed,
    NotFound,
}

/// Finds the route for `method` and `path`.
pub(crate) fn find<'a>(method: &Method, path: &str) -> Match<'a> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut path_matched = false;
    for route in routes() {
        let Some(params) = match_path(route.path, &segments) else { continue };
        path_matched = true;
        if route.method == *method {
            return Match::Found(route, params);
        }
    }
    if path_matched { Match::MethodNotAllowed } else { Match::NotFound }
}

fn match_path(pattern: &str, segments: &[&str]) -> Option<Vec<String>> {
    let parts: Vec<&str> = pattern.split('/').collect();
    if parts.len() != segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (part, seg) in parts.iter().zip(segments) {
        if part.starts_with('{') {
            if seg.is_empty() {
                return None;
            }
            params.push(percent_decode(seg)?);
        } else if part != seg {
            return None;
        }
    }
    Some(params)
}

/// Decodes `%XX` escapes; `None` for malformed escapes or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_with_parameters_and_decode_them() {
        match find(&Method::POST, "/v1/admin/models/qwen3%3A8b/load") {
            Match::Found(route, params) => {
                assert_eq!(route.path, "/v1/admin/models/{name}/load");
                assert_eq!(params, ["qwen3:8b"]);
            }
            _ => panic!("no match"),
        }
        assert!(matches!(find(&Method::GET, "/v1/admin/models/x/load"), Match::MethodNotAllowed));
        assert!(matches!(find(&Method::GET, "/nope"), Match::NotFound));
        assert!(matches!(find(&Method::GET, "/v1/admin/models//load"), Match::NotFound));
        assert!(matches!(find(&Method::GET, "/healthz/"), Match::Found(..)));
    }

    #[test]
    fn every_route_is_unique_and_described() {
        let mut seen = std::collections::BTreeSet::new();
        for r in routes() {
            assert!(seen.insert((r.method.as_str(), r.path)), "duplicate {} {}", r.method, r.path);
            assert!(!r.summary.is_empty() && r.description.len() > 10, "{} {}", r.method, r.path);
        }
    }

    #[test]
    fn malformed_escapes_do_not_match() {
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%zz"), None);
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
    }
}
