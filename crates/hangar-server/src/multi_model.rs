//! Multi-model operations (`multi-model.md`, Lemonade-style, `/api/v1/…`): health with
//! every loaded model, stats, load with Lemonade's arguments, and unload of one model or
//! all.
//!
//! Lemonade's load arguments map onto the admin API's override machinery
//! (`specs/README.md`, point 5): `ctx_size` becomes the backend's context field;
//! `llamacpp_args` (validated: no `--port`, `--host`, `-m`) replaces the model's
//! `llama_server_extra_args` for this load, and `llamacpp_backend` picks one of the model's
//! configured `llama_server_backends` builds as `llama_server_binary_path` for this load;
//! both only for `llama_server` models. Like every override they last one load and show in
//! the model's `load_override`.

use std::num::NonZeroU32;

use hangar_config::{BackendKind, LLAMA_SERVER_MANAGED_ARGS};
use hangar_lifecycle::ModelState;
use hangar_runtime::{LoadOptions, ModelSnapshot};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, codes};
use crate::router::Ctx;

/// Body of `POST /api/v1/load`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MultiModelLoadBody")]
pub(crate) struct LoadBody {
    /// The configured model to load.
    model_name: String,
    /// Context size for this load, mapped to the backend's context field: `gguf_n_ctx`
    /// (llama_cpp), `llama_server_n_ctx` (llama_server), `vllm_max_model_len` (vllm,
    /// vllm_serve), `exllama_cache_size` (exllamav3). 400 `invalid_load_request` for other
    /// backends.
    #[serde(default)]
    ctx_size: Option<NonZeroU32>,
    /// Extra llama-server arguments (a string split on whitespace, or one argument per
    /// element); llama_server models only. Hangar-managed flags (`--port`, `--host`, `-m`,
    /// `--model`) are refused. This version cannot apply extra arguments at load time:
    /// they are configured in the model definition (`llama_server_extra_args`), so a
    /// non-empty value answers 400 `invalid_load_request`.
    #[serde(default)]
    llamacpp_args: Option<LlamacppArgs>,
    /// The llama.cpp build to run (Lemonade's `--llamacpp`); llama_server models only.
    /// This version cannot switch builds at load time: the binary is configured in the
    /// model definition (`llama_server_binary_path`), so a non-empty value answers 400
    /// `invalid_load_request`.
    #[serde(default)]
    llamacpp_backend: Option<String>,
    /// Replicas for this load, 1..=replica_max; the configured count when absent.
    #[serde(default)]
    replicas: Option<NonZeroU32>,
}

/// Extra llama-server arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum LlamacppArgs {
    /// One string, split on whitespace.
    Line(String),
    /// One argument per element.
    List(Vec<String>),
}

impl LlamacppArgs {
    fn into_args(self) -> Vec<String> {
        match self {
            Self::Line(line) => line.split_whitespace().map(str::to_owned).collect(),
            Self::List(list) => list,
        }
    }
}

/// Body of `POST /api/v1/unload`; the body may also be empty.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MultiModelUnloadBody")]
pub(crate) struct UnloadBody {
    /// The model to unload (404 when it is not loaded); every loaded model when absent.
    #[serde(default)]
    model_name: Option<String>,
}

/// One loaded model in `GET /api/v1/health`.
#[derive(Debug, Serialize)]
struct LoadedModel {
    model_name: String,
    checkpoint: Option<String>,
    last_use: Option<u64>,
    #[serde(rename = "type")]
    model_type: Value,
    device: Value,
    backend_url: Option<String>,
    recipe: BackendKind,
    backend: BackendKind,
}

/// The model's `model_path`, as its definition says.
fn checkpoint(model: &ModelSnapshot) -> Option<String> {
    model.definition.get("model_path").and_then(Value::as_str).map(str::to_owned)
}

impl LoadedModel {
    fn of(model: &ModelSnapshot) -> Self {
        Self {
            model_name: model.name.clone(),
            checkpoint: checkpoint(model),
            last_use: model.last_use_unix_ms,
            model_type: serde_json::to_value(model.model_type).unwrap_or_default(),
            device: serde_json::to_value(model.device).unwrap_or_default(),
            // Every backend of this version runs in-process or behind Hangar's own bridge;
            // subprocess URLs are reported once the runtime exposes them.
            backend_url: None,
            recipe: model.resolved_backend,
            backend: model.resolved_backend,
        }
    }
}

/// `GET /api/v1/health`: `model_loaded` / `checkpoint_loaded` name the most recently loaded
/// model while it is loaded; once that one is unloaded, the most recently used of the models
/// still loaded (the manager remembers only the last load); `null` when nothing is loaded.
/// `all_models_loaded` lists every loaded model.
pub(crate) async fn health(ctx: Ctx) -> Result<Response, ApiError> {
    let manager = &ctx.state.manager;
    let models = manager.models();
    let loaded = || models.iter().filter(|m| m.is_loaded);
    let last = match manager.last_loaded() {
        Some(name) => loaded().find(|m| m.name == name.as_str()),
        None => None,
    }
    .or_else(|| loaded().max_by_key(|m| m.last_use_unix_ms));
    let all: Vec<LoadedModel> =
        models.iter().filter(|m| m.is_loaded).map(LoadedModel::of).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "model_loaded": last.map(|m| m.name.clone()),
            "checkpoint_loaded": last.and_then(checkpoint),
            "all_models_loaded": all,
        }),
    ))
}

/// `GET /api/v1/stats`.
///
/// Statistics of the most recent inference request, on Lemonade's fields
/// (`time_to_first_token`, `tokens_per_second`, `input_tokens`, `output_tokens`;
/// `null` until a generation has completed), plus the model it ran on and what the runtime
/// tracks: loaded models and lifetime counters.
pub(crate) async fn stats(ctx: Ctx) -> Result<Response, ApiError> {
    let manager = &ctx.state.manager;
    let loaded = manager.models().iter().filter(|m| m.is_loaded).count();
    let last = ctx.state.last_generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let field =
        |f: &dyn Fn(&crate::state::GenerationStats) -> Value| last.as_ref().map_or(Value::Null, f);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "time_to_first_token": field(&|s| json!(s.time_to_first_token)),
            "tokens_per_second": field(&|s| json!(s.tokens_per_second)),
            "input_tokens": field(&|s| json!(s.input_tokens)),
            "output_tokens": field(&|s| json!(s.output_tokens)),
            "model": field(&|s| json!(s.model)),
            "endpoint": field(&|s| json!(s.endpoint)),
            "finished_unix_ms": field(&|s| json!(s.finished_unix_ms)),
            "models_loaded": loaded,
            "last_loaded_model": manager.last_loaded().map(|n| n.to_string()),
            "counters": manager.counters(),
        }),
    ))
}

/// The backend's load-override field that holds the context size.
fn ctx_field(backend: BackendKind) -> Option<&'static str> {
    match backend {
        BackendKind::LlamaCpp => Some("gguf_n_ctx"),
        BackendKind::LlamaServer => Some("llama_server_n_ctx"),
        BackendKind::Vllm | BackendKind::VllmServe => Some("vllm_max_model_len"),
        BackendKind::ExLlamaV3 => Some("exllama_cache_size"),
        _ => None,
    }
}

fn invalid_load(field: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_LOAD_REQUEST, message)
        .with("field", field.into())
}

/// `POST /api/v1/load`: loads `model_name` with Lemonade's arguments mapped onto load
/// overrides, and answers with the model.
pub(crate) async fn load(ctx: Ctx) -> Result<Response, ApiError> {
    let body: LoadBody = parse_json(&ctx.body, false)?;
    let manager = &ctx.state.manager;
    let name = body.model_name.as_str();
    let model = manager.model(name)?;
    let backend = model.resolved_backend;
    let llama_server = backend == BackendKind::LlamaServer;

    let mut engine_fields = Map::new();
    let args = body.llamacpp_args.map(LlamacppArgs::into_args).unwrap_or_default();
    if !args.is_empty() {
        if !llama_server {
            return Err(invalid_load(
                "llamacpp_args",
                format!(
                    "llamacpp_args applies only to llama_server models; model '{name}' uses \
                     backend {backend}"
                ),
            ));
        }
        for arg in &args {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
            if LLAMA_SERVER_MANAGED_ARGS.contains(&flag) {
                return Err(invalid_load(
                    "llamacpp_args",
                    format!("`{flag}` is managed by Hangar and cannot be passed as an argument"),
                ));
            }
        }
        engine_fields.insert("llama_server_extra_args".to_owned(), json!(args));
    }
    if let Some(build) = body.llamacpp_backend.as_deref().filter(|b| !b.trim().is_empty()) {
        if !llama_server {
            return Err(invalid_load(
                "llamacpp_backend",
                format!(
                    "llamacpp_backend applies only to llama_server models; model '{name}' uses \
                     backend {backend}"
                ),
            ));
        }
        let builds = model.definition.get("llama_server_backends").and_then(Value::as_object);
        let Some(path) = builds.and_then(|b| b.get(build)).cloned() else {
            let known: Vec<&str> =
                builds.map(|b| b.keys().map(String::as_str).collect()).unwrap_or_default();
            return Err(invalid_load(
                "llamacpp_backend",
                format!(
                    "llamacpp_backend `{build}` is not one of model '{name}''s llama_server_backends \
                     ({})",
                    if known.is_empty() { "none configured".to_owned() } else { known.join(", ") }
                ),
            ));
        };
        engine_fields.insert("llama_server_binary_path".to_owned(), path);
    }

    let mut overrides = Map::new();
    let ctx_target = match body.ctx_size {
        None => None,
        Some(size) => {
            let Some(field) = ctx_field(backend) else {
                return Err(invalid_load(
                    "ctx_size",
                    format!("ctx_size is not supported for backend {backend}"),
                ));
            };
            overrides.insert(field.to_owned(), size.get().into());
            Some(field)
        }
    };
    let options = LoadOptions { replicas: body.replicas, overrides, engine_fields };

    // The same options as the running load: nothing to change.
    let mut requested = options.overrides.clone();
    requested.extend(options.engine_fields.clone());
    if model.is_loaded
        && !requested.is_empty()
        && requested == *model.load_override.fields()
        && options.replicas.is_none_or(|r| r.get() == model.replicas)
    {
        return Ok(json_response(StatusCode::OK, &model));
    }

    let snapshot = manager.load(name, options).await.map_err(|e| {
        let mut api = ApiError::from(e);
        // Errors about the mapped field name the argument the caller sent.
        if let Some(field) = ctx_target
            && api.extra.get("field").and_then(Value::as_str) == Some(field)
        {
            api.message = format!("ctx_size (the {field} of backend {backend}): {}", api.message);
            api.extra.insert("field".into(), "ctx_size".into());
        }
        api
    })?;
    Ok(json_response(StatusCode::OK, &snapshot))
}

/// `POST /api/v1/unload`: unloads `model_name` (404 when it is not loaded), or every loaded
/// model without one.
pub(crate) async fn unload(ctx: Ctx) -> Result<Response, ApiError> {
    let body: UnloadBody = parse_json(&ctx.body, true)?;
    let manager = &ctx.state.manager;
    let unloaded = match body.model_name {
        Some(name) => {
            let model = manager.model(&name)?;
            match model.runtime_state {
                // Loading: the manager's 409 says to wait for the load.
                ModelState::Loaded | ModelState::Loading => {
                    manager.unload(&name).await?;
                }
                state => {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        codes::MODEL_NOT_LOADED,
                        format!("model '{name}' is not loaded (it is {state})"),
                    )
                    .with("runtime_state", state.as_str().into()));
                }
            }
            vec![name]
        }
        None => {
            let before: Vec<String> =
                manager.models().into_iter().filter(|m| m.is_loaded).map(|m| m.name).collect();
            let after = manager.unload_all().await;
            before
                .into_iter()
                .filter(|n| after.iter().any(|m| m.name == *n && !m.is_loaded))
                .collect()
        }
    };
    Ok(json_response(StatusCode::OK, &json!({ "status": "ok", "unloaded": unloaded })))
}
