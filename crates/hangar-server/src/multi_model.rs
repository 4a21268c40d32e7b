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

use hangar_config::{BackendKind, Device, LemonadeArg, LemonadeArgs, Mapped, ModelType};
use hangar_runtime::ModelState;
use hangar_runtime::{LoadOptions, ModelSnapshot};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Map;

use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, HttpCode, RuntimeCode};
use crate::metrics::Endpoint;
use crate::openai::constant;
use crate::router::Ctx;

/// Body of `POST /api/v1/load`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MultiModelLoadBody")]
pub(crate) struct LoadBody {
    /// The configured model to load.
    #[schemars(length(min = 1))]
    model_name: String,
    /// Context size for this load, mapped to the backend's context field: `gguf_n_ctx`
    /// (llama_cpp), `llama_server_n_ctx` (llama_server), `vllm_max_model_len` (vllm,
    /// vllm_serve), `exllama_cache_size` (exllamav3). 400 `invalid_load_request` for other
    /// backends.
    #[serde(default)]
    ctx_size: Option<NonZeroU32>,
    /// Extra llama-server arguments for this load (a string split on whitespace, or one
    /// argument per element), replacing `llama_server_extra_args`; llama_server models
    /// only. Only flags that touch neither files, the network nor the engine's auth are
    /// accepted: `-t --threads -tb --threads-batch -b --batch-size -ub --ubatch-size -c
    /// --ctx-size -np --parallel -cb --cont-batching -nocb --no-cont-batching -fa
    /// --flash-attn -ctk --cache-type-k -ctv --cache-type-v -nkvo --no-kv-offload -ngl
    /// --gpu-layers --n-gpu-layers -sm --split-mode -ts --tensor-split -mg --main-gpu --mlock
    /// --no-mmap --jinja --reasoning-format --reasoning-budget --no-webui -n --n-predict
    /// --keep --cache-reuse --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n
    /// --presence-penalty --frequency-penalty -s --seed`; any other flag, or a value with a
    /// path, answers 400 `invalid_load_request` naming it.
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
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "MultiModelUnloadBody")]
pub(crate) struct UnloadBody {
    /// The model to unload (404 when it is not loaded); every loaded model when absent.
    #[serde(default)]
    model_name: Option<String>,
}

constant!(
    /// `ok`.
    StatusOk = "ok"
);

/// One loaded model in `GET /api/v1/health`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LoadedModel {
    /// The model.
    model_name: String,
    /// Its `model_path`; `null` without a key while keys are configured.
    checkpoint: Option<String>,
    /// Last access, Unix milliseconds.
    last_use: Option<u64>,
    /// What it serves.
    #[serde(rename = "type")]
    model_type: ModelType,
    /// Devices it occupies.
    #[schemars(with = "Vec<String>")]
    device: Device,
    /// The URL of the engine's own server; `null` for engines in Hangar's process, and
    /// without a key while keys are configured.
    backend_url: Option<String>,
    /// The backend (Lemonade's name for it).
    recipe: BackendKind,
    /// The backend.
    backend: BackendKind,
}

impl LoadedModel {
    /// `model`'s entry; its checkpoint path and engine URL only when `disclose`.
    fn of(model: &ModelSnapshot, disclose: bool) -> Self {
        Self {
            model_name: model.name().to_owned(),
            checkpoint: model.config.model_path.clone().filter(|_| disclose),
            last_use: model.last_use_unix_ms,
            model_type: model.model_type,
            device: model.device,
            // The first replica's engine server, as its runtime reports it.
            backend_url: model
                .runtime_details
                .first()
                .and_then(|d| d.get("backend_url"))
                .and_then(|u| u.as_str())
                .filter(|_| disclose)
                .map(str::to_owned),
            recipe: model.resolved_backend,
            backend: model.resolved_backend,
        }
    }
}

/// `GET /api/v1/health`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HealthResponse {
    /// Always `ok`.
    status: StatusOk,
    /// The most recently loaded model still loaded (else the most recently used loaded one).
    model_loaded: Option<String>,
    /// Its `model_path`; `null` without a key while keys are configured.
    checkpoint_loaded: Option<String>,
    /// Every loaded model.
    all_models_loaded: Vec<LoadedModel>,
}

/// `GET /api/v1/stats`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct StatsResponse {
    /// Seconds to the first generated token of the most recent generation.
    time_to_first_token: Option<f64>,
    /// Its tokens per second after the first.
    tokens_per_second: Option<f64>,
    /// Its prompt tokens.
    input_tokens: Option<u32>,
    /// Its generated tokens.
    output_tokens: Option<u32>,
    /// The model that served it.
    model: Option<String>,
    /// The endpoint it came through.
    endpoint: Option<Endpoint>,
    /// When it finished, Unix milliseconds.
    finished_unix_ms: Option<u64>,
    /// Models loaded now.
    models_loaded: u32,
    /// The most recently loaded model still loaded.
    last_loaded_model: Option<String>,
    /// Lifetime counters.
    counters: crate::wire::ManagerCounters,
}

/// `POST /api/v1/unload`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct UnloadResponse {
    /// Always `ok`.
    status: StatusOk,
    /// The models this call unloaded.
    unloaded: Vec<String>,
}

/// `GET /api/v1/health`: `model_loaded` / `checkpoint_loaded` name the most recently loaded
/// model while it is loaded; once that one is unloaded, the most recently used of the models
/// still loaded (the manager remembers only the last load); `null` when nothing is loaded.
/// `all_models_loaded` lists every loaded model.
pub(crate) async fn health(ctx: Ctx) -> Result<Response, ApiError> {
    let manager = &ctx.state.manager;
    let loaded = manager
        .list(&hangar_runtime::ModelFilter { state: Some(ModelState::Loaded), model_type: None });
    let last = match manager.last_loaded() {
        Some(name) => loaded.iter().find(|m| m.name() == name.as_str()),
        None => None,
    }
    .or_else(|| loaded.iter().max_by_key(|m| m.last_use_unix_ms));
    // An open route: while keys are set, paths and engine URLs only for key holders.
    let disclose = crate::auth::discloses(&ctx.state.options, &ctx.headers);
    let answer = HealthResponse {
        status: StatusOk::Value,
        model_loaded: last.map(|m| m.name().to_owned()),
        checkpoint_loaded: last.and_then(|m| m.config.model_path.clone()).filter(|_| disclose),
        all_models_loaded: loaded.iter().map(|m| LoadedModel::of(m, disclose)).collect(),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// `GET /api/v1/stats`: statistics of the most recent inference request, on Lemonade's
/// fields (`null` until a generation has completed), plus the model it ran on and what the
/// runtime tracks: loaded models and lifetime counters.
pub(crate) async fn stats(ctx: Ctx) -> Result<Response, ApiError> {
    let manager = &ctx.state.manager;
    let loaded = hangar_runtime::ModelFilter { state: Some(ModelState::Loaded), model_type: None };
    let models_loaded = manager.statuses(&loaded).len() as u32;
    let last = ctx.state.last_generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let answer = StatsResponse {
        time_to_first_token: last.as_ref().and_then(|s| s.time_to_first_token),
        tokens_per_second: last.as_ref().and_then(|s| s.tokens_per_second),
        input_tokens: last.as_ref().map(|s| s.input_tokens),
        output_tokens: last.as_ref().map(|s| s.output_tokens),
        model: last.as_ref().map(|s| s.model.clone()),
        endpoint: last.as_ref().map(|s| s.endpoint),
        finished_unix_ms: last.as_ref().map(|s| s.finished_unix_ms),
        models_loaded,
        last_loaded_model: manager.last_loaded().map(|n| n.to_string()),
        counters: manager.counters().into(),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

fn invalid_load(field: &str, message: String) -> ApiError {
    ApiError::new(RuntimeCode::InvalidLoadRequest, message).with_field(field)
}

/// `POST /api/v1/load`: loads `model_name` with Lemonade's arguments mapped onto load
/// overrides (the same options as the running load are a no-op), and answers with the
/// model.
pub(crate) async fn load(ctx: Ctx) -> Result<Response, ApiError> {
    let body: LoadBody = parse_json(&ctx.body, false)?;
    let manager = &ctx.state.manager;
    let name = body.model_name.as_str();
    let model = manager.model(name)?;
    let backend = model.resolved_backend;
    let llama_server = backend == BackendKind::LlamaServer;

    let args = body.llamacpp_args.map(LlamacppArgs::into_args).unwrap_or_default();
    if llama_server && !args.is_empty() {
        // From a request: only flags that touch neither files, the network nor the
        // engine's auth, and no paths in values.
        hangar_config::check_request_args(&args)
            .map_err(|why| invalid_load("llamacpp_args", why))?;
    }
    let lemonade = LemonadeArgs {
        ctx_size: body.ctx_size,
        llamacpp_args: (!args.is_empty()).then_some(args),
        llamacpp_backend: body.llamacpp_backend,
    };
    let (mut overrides, mut engine_fields, mut ctx_target) = (Map::new(), Map::new(), None);
    for Mapped { arg, field } in lemonade.map(&model.config) {
        let (field, value) = field.map_err(|why| invalid_load(arg.into(), why))?;
        match arg {
            // The context size is a live-load field like the admin API's overrides.
            LemonadeArg::CtxSize => {
                ctx_target = Some(field);
                overrides.insert(field.to_owned(), value);
            }
            LemonadeArg::LlamacppArgs | LemonadeArg::LlamacppBackend => {
                engine_fields.insert(field.to_owned(), value);
            }
        }
    }
    let options = LoadOptions { replicas: body.replicas, overrides, engine_fields };
    let snapshot = manager.ensure_loaded(name, options).await.map_err(|e| {
        let mut api = ApiError::from(e);
        // Errors about the mapped field name the argument the caller sent.
        if let Some(field) = ctx_target
            && api.field.as_deref() == Some(field)
        {
            api.message = format!("ctx_size (the {field} of backend {backend}): {}", api.message);
            api.field = Some("ctx_size".into());
        }
        api
    })?;
    Ok(json_response(StatusCode::OK, &ctx.state.rows.row(&snapshot)))
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
                    let mut error = ApiError::new(
                        HttpCode::NothingToUnload,
                        format!("model '{name}' is not loaded (it is {state}); nothing to unload"),
                    );
                    error.runtime_state = Some(state.into());
                    return Err(error);
                }
            }
            vec![name]
        }
        None => manager.unload_all().await,
    };
    Ok(json_response(StatusCode::OK, &UnloadResponse { status: StatusOk::Value, unloaded }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_request_flags_are_the_allowed_ones() {
        let source = include_str!("multi_model.rs");
        let doc: String = source
            .lines()
            .skip_while(|l| !l.contains("Extra llama-server arguments for this load"))
            .take_while(|l| l.trim_start().starts_with("///"))
            .map(|l| l.trim_start().trim_start_matches("///"))
            .collect::<Vec<_>>()
            .join(" ");
        let listed = doc.split("accepted: `").nth(1).and_then(|rest| rest.split('`').next());
        let listed: Vec<&str> = listed.unwrap_or_default().split_whitespace().collect();
        assert_eq!(listed, hangar_config::LLAMA_SERVER_REQUEST_ARGS, "the OpenAPI text lists them");
    }
}
