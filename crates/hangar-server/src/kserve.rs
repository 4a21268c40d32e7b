//! KServe v2 / Triton routes (`model-repository.md`): server metadata, health, model
//! readiness and the model-repository extension (index, load, unload), mapped onto the
//! same [`hangar_runtime::Manager`] as the admin API.
//!
//! Every error answers with the v2 envelope `{"error": "…"}` (the router wraps these
//! handlers with [`ApiError::into_v2_response`]); statuses come from the one mapping of
//! control-plane errors ([`ApiError::from`]).
//!
//! Load follows Triton's reload rule (`specs/README.md`, point 4): an already loaded model
//! without `parameters.config` is a no-op; with it, the model is reloaded with that config
//! as the runtime-only override patch — atomically ([`hangar_runtime::Manager::reload`]):
//! the patch is checked first, and the old runtime serves until the new one is loaded, or
//! keeps serving when the reload fails. `file:` parameters are refused: no model
//! definitions arrive over the API.
//!
//! The keyless local agent ([`Caller::LocalAgent`]) may index, load and unload only the
//! models of the model repository folder, never a configured, pinned or leased one and never
//! with `parameters.config`; its index shows the reasons of those models only.
//!
//! The rules live in the functions the gRPC service calls too ([`index_entries`],
//! [`load_model`], [`unload_model`], [`readiness`], [`model_metadata`],
//! [`server_metadata_value`]); the handlers here only parse and encode.

use hangar_runtime::ModelState;
use hangar_runtime::{LoadOptions, Manager};
use http::StatusCode;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::auth::Caller;
use crate::body::{Response, empty_response, json_response, parse_json};
use crate::error::{ApiError, HttpCode, RuntimeCode};
use crate::health::not_ready;
use crate::router::Ctx;

/// The name `GET /v2` reports.
const SERVER_NAME: &str = "hangar";

/// The only version of every model: Hangar models are not versioned.
pub(crate) const MODEL_VERSION: &str = "1";

/// The prefix of Triton's model-file parameters (`file:<version>/<file-name>`).
const FILE_PARAMETER_PREFIX: &str = "file:";

/// Body of `POST /v2/repository/index`. The body may also be empty (as Triton's clients send
/// it), which reads as `{}`.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "RepositoryIndexBody")]
pub(crate) struct IndexBody {
    /// When true, list only the models ready for inferencing (`READY`). Default false.
    #[serde(default)]
    ready: Option<bool>,
}

/// Body of `POST /v2/repository/models/{name}/load`. The body may also be empty.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RepositoryLoadBody")]
pub(crate) struct LoadBody {
    /// Load parameters as key/value pairs.
    #[serde(default)]
    parameters: Option<LoadParameters>,
}

/// The parameters of a repository load.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "RepositoryLoadParameters", deny_unknown_fields)]
pub(crate) struct LoadParameters {
    /// The runtime-only override patch for this load: a JSON object, or a string holding
    /// one (as Triton's clients send it). It takes the fields of the model's
    /// `load_constraints` (e.g. `gguf_n_ctx`) and `replicas`; a `name` key, when present,
    /// must be the model's name. When present the model is (re)loaded with it: a loaded
    /// model is unloaded and loaded again. Never written back to config.
    #[serde(default)]
    #[schemars(schema_with = "config_schema")]
    config: Option<Value>,
    /// Any other parameter is refused with 400: `file:<version>/<file-name>` because model
    /// definitions do not arrive over the API, anything else as unknown.
    #[serde(flatten)]
    #[schemars(skip)]
    other: Map<String, Value>,
}

impl LoadParameters {
    /// The parameters of a load given as a map (gRPC's `parameters`).
    pub(crate) fn from_map(mut map: Map<String, Value>) -> Self {
        Self { config: map.remove("config"), other: map }
    }
}

/// Body of `POST /v2/repository/models/{name}/unload`. The body may also be empty.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RepositoryUnloadBody")]
pub(crate) struct UnloadBody {
    /// Unload parameters as key/value pairs.
    #[serde(default)]
    parameters: Option<UnloadParameters>,
}

/// The parameters of a repository unload.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "RepositoryUnloadParameters", deny_unknown_fields)]
pub(crate) struct UnloadParameters {
    /// Accepted for Triton compatibility; Hangar models have no dependents, so it changes
    /// nothing.
    #[serde(default)]
    unload_dependents: Option<bool>,
    /// Any other parameter is refused with 400 as unknown.
    #[serde(flatten)]
    #[schemars(skip)]
    other: Map<String, Value>,
}

impl UnloadParameters {
    /// The parameters of an unload given as a map (gRPC's `parameters`).
    ///
    /// # Errors
    /// 400 when `unload_dependents` is not a boolean.
    pub(crate) fn from_map(mut map: Map<String, Value>) -> Result<Self, ApiError> {
        let unload_dependents = match map.remove("unload_dependents") {
            None => None,
            Some(Value::Bool(b)) => Some(b),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "parameter `unload_dependents` must be a boolean, got {}",
                    hangar_config::json_kind(&other)
                )));
            }
        };
        Ok(Self { unload_dependents, other: map })
    }
}

/// The schema of `parameters.config`: an override patch object (the model's name, its
/// replicas and live-load fields), or a string holding one.
fn config_schema(_: &mut SchemaGenerator) -> Schema {
    let mut properties = crate::admin::override_properties();
    properties.insert(
        "name".into(),
        serde_json::json!({ "description": "The model's name, when given.", "type": "string" }),
    );
    properties.insert(
        "replicas".into(),
        serde_json::json!({ "description": "Replicas for this load.", "type": ["integer", "null"], "minimum": 1, "maximum": u32::MAX }),
    );
    json_schema!({
        "description": "The override patch: a JSON object, or a string holding one.",
        "oneOf": [
            {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": { "type": "object", "properties": properties.clone(), "additionalProperties": false }
            },
            { "type": "object", "properties": properties, "additionalProperties": false },
            { "type": "null" }
        ]
    })
}

/// A model's state in the repository index.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum IndexState {
    /// Loaded.
    Ready,
    /// Loading.
    Loading,
    /// Unloading.
    Unloading,
    /// Not loaded (`reason` says why: unloaded, or the load error).
    Unavailable,
}

/// One row of the repository index.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct IndexEntry {
    /// The model.
    pub(crate) name: String,
    /// Always `1`: Hangar models are not versioned.
    pub(crate) version: String,
    /// Its state.
    pub(crate) state: IndexState,
    /// Why it is unavailable; empty otherwise.
    pub(crate) reason: String,
}

impl IndexEntry {
    fn of(name: String, state: ModelState, last_error: Option<String>) -> Self {
        let (state, reason) = match state {
            ModelState::Loaded => (IndexState::Ready, String::new()),
            ModelState::Loading => (IndexState::Loading, String::new()),
            ModelState::Unloading => (IndexState::Unloading, String::new()),
            ModelState::Failed => {
                (IndexState::Unavailable, last_error.unwrap_or_else(|| "load failed".to_owned()))
            }
            // A repository model whose definition does not hold says why.
            ModelState::Unloaded => {
                (IndexState::Unavailable, last_error.unwrap_or_else(|| "unloaded".to_owned()))
            }
        };
        Self { name, version: MODEL_VERSION.to_owned(), state, reason }
    }
}

/// `GET /v2`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ServerMetadata {
    /// Always `hangar`.
    pub(crate) name: String,
    /// Hangar's version.
    pub(crate) version: String,
    /// Always `["model_repository"]`.
    pub(crate) extensions: Vec<String>,
}

/// `GET /v2/models/{name}`: a model's KServe v2 metadata.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ModelMetadata {
    /// The model.
    pub(crate) name: String,
    /// Always `["1"]`: Hangar models are not versioned.
    pub(crate) versions: Vec<String>,
    /// The engine that runs it (its `backend`, e.g. `llama_cpp`).
    pub(crate) platform: String,
    /// Always empty: Hangar's models take OpenAI-compatible JSON, not tensors.
    pub(crate) inputs: Vec<Value>,
    /// Always empty.
    pub(crate) outputs: Vec<Value>,
}

/// The server's metadata.
pub(crate) fn server_metadata_value() -> ServerMetadata {
    ServerMetadata {
        name: SERVER_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        extensions: vec!["model_repository".to_owned()],
    }
}

/// A model's metadata.
///
/// # Errors
/// 404 `unknown_model`.
pub(crate) fn model_metadata(manager: &Manager, name: &str) -> Result<ModelMetadata, ApiError> {
    let model = manager.model(name)?;
    Ok(ModelMetadata {
        name: model.name().to_owned(),
        versions: vec![MODEL_VERSION.to_owned()],
        platform: model.resolved_backend.as_str().to_owned(),
        inputs: Vec::new(),
        outputs: Vec::new(),
    })
}

/// Whether a configured model is ready: `Ok(Ok(()))` when loaded, `Ok(Err(why))` when it
/// is not (its state, and with `with_error` the error of a failed one).
///
/// # Errors
/// 404 `unknown_model`.
pub(crate) fn readiness(
    manager: &Manager,
    name: &str,
    with_error: bool,
) -> Result<Result<(), String>, ApiError> {
    let model = manager.model(name)?;
    if model.is_loaded {
        return Ok(Ok(()));
    }
    let mut message =
        format!("model '{}' is not ready: it is {}", model.name(), model.runtime_state);
    if let (ModelState::Failed, Some(error), true) =
        (model.runtime_state, &model.last_error, with_error)
    {
        message.push_str(&format!(" ({error})"));
    }
    Ok(Err(message))
}

/// Refuses a model version other than none or [`MODEL_VERSION`].
///
/// # Errors
/// 404 `unknown_model`, naming the version.
pub(crate) fn check_version(name: &str, version: &str) -> Result<(), ApiError> {
    if version.is_empty() || version == MODEL_VERSION {
        return Ok(());
    }
    Err(ApiError::new(
        RuntimeCode::UnknownModel,
        format!("model '{name}' has no version '{version}': Hangar models have one version, 1"),
    ))
}

/// The repository index: every configured model with its state, or only the ready ones;
/// the model repository folder is read again first. The local agent sees the reasons of
/// the repository folder's models only; the others' are their bare state.
pub(crate) async fn index_entries(
    manager: &Manager,
    only_ready: bool,
    caller: Caller,
) -> Vec<IndexEntry> {
    manager.rescan_repository().await;
    let filter = hangar_runtime::ModelFilter {
        state: only_ready.then_some(ModelState::Loaded),
        model_type: None,
    };
    let shown = |m: &hangar_runtime::ModelStatus| {
        caller == Caller::Keyed || manager.model(m.name.as_str()).is_ok_and(|s| s.from_repository)
    };
    manager
        .statuses(&filter)
        .into_iter()
        .map(|m| {
            let reason = if shown(&m) { m.last_error } else { None };
            IndexEntry::of(m.name.to_string(), m.state, reason)
        })
        .collect()
}

/// Refuses the local agent a model it may not load or unload: one the config defines,
/// or one that is pinned. A model no longer served (its folder deleted) is the unload's
/// to answer.
///
/// # Errors
/// 403 `forbidden`, naming the rule.
fn agent_may_touch(manager: &Manager, name: &str, caller: Caller) -> Result<(), ApiError> {
    if caller == Caller::Keyed {
        return Ok(());
    }
    let Ok(model) = manager.model(name) else { return Ok(()) };
    let why = if !model.from_repository {
        "is defined by the config, not the model repository folder"
    } else if model.pinned {
        "is pinned"
    } else {
        return Ok(());
    };
    Err(ApiError::new(
        HttpCode::Forbidden,
        format!(
            "model '{}' {why}: the keyless local agent may load and unload only the repository \
             folder's models; send the admin key",
            model.name()
        ),
    ))
}

/// Refuses a model the repository does not know, after reading the model repository folder
/// again (a folder that appeared since the last read is a model to load).
///
/// # Errors
/// `unknown_model`.
pub(crate) async fn known(manager: &Manager, name: &str) -> Result<(), ApiError> {
    manager.rescan_repository().await;
    manager.model(name)?;
    Ok(())
}

/// A repository load: a plain load without `config`, a reload with it. The caller has
/// checked the model is [`known`] (both routes do so first).
///
/// # Errors
/// 400 for `file:` or unknown parameters and a bad `config`, and the load's own errors.
pub(crate) async fn load_model(
    manager: &Manager,
    name: &str,
    parameters: LoadParameters,
    caller: Caller,
) -> Result<(), ApiError> {
    refuse_other_parameters(&parameters.other, &["config"])?;
    agent_may_touch(manager, name, caller)?;
    let patch = config_patch(name, parameters.config)?;
    if caller == Caller::LocalAgent && patch.is_some() {
        return Err(ApiError::new(
            HttpCode::Forbidden,
            "parameters.config is refused to the keyless local agent: an override patch needs \
             the admin key",
        ));
    }
    match patch {
        // No config: Triton's no-op for a loaded model, else a plain load.
        None => manager.load(name, LoadOptions::default()).await?,
        Some(patch) => manager.reload(name, crate::admin::split_load_patch(patch)?).await?,
    };
    Ok(())
}

/// A repository unload: graceful; the local agent's never takes a leased model.
///
/// # Errors
/// 400 for unknown parameters, 403 for a model the local agent may not unload, and the
/// unload's own errors (409 for a leased model the agent asked for).
pub(crate) async fn unload_model(
    manager: &Manager,
    name: &str,
    parameters: UnloadParameters,
    caller: Caller,
) -> Result<(), ApiError> {
    refuse_other_parameters(&parameters.other, &["unload_dependents"])?;
    if parameters.unload_dependents == Some(true) {
        tracing::debug!(model = name, "unload_dependents: Hangar models have no dependents");
    }
    agent_may_touch(manager, name, caller)?;
    match caller {
        Caller::Keyed => manager.unload(name).await?,
        Caller::LocalAgent => manager.unload_unless_held(name).await?,
    };
    // A folder deleted before the unload (KServe's agent does so) leaves now.
    manager.rescan_repository().await;
    Ok(())
}

/// The empty object Triton answers on a successful load or unload.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Empty {}

fn empty_object() -> Response {
    json_response(StatusCode::OK, &Empty {})
}

/// `GET /v2`: server metadata.
pub(crate) async fn server_metadata(_ctx: Ctx) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &server_metadata_value()))
}

/// `GET /v2/models/{name}`: model metadata.
pub(crate) async fn model_metadata_route(ctx: Ctx) -> Result<Response, ApiError> {
    let metadata = model_metadata(&ctx.state.manager, ctx.name())?;
    Ok(json_response(StatusCode::OK, &metadata))
}

/// `GET /v2/health/live`: 200 with an empty body while the process answers.
pub(crate) async fn live(_ctx: Ctx) -> Result<Response, ApiError> {
    Ok(empty_response(StatusCode::OK))
}

/// `GET /v2/health/ready`: 200 with an empty body when every enabled model is loaded, else
/// 503 naming the ones that are not.
pub(crate) async fn ready(ctx: Ctx) -> Result<Response, ApiError> {
    let waiting = not_ready(&ctx);
    if waiting.is_empty() {
        return Ok(empty_response(StatusCode::OK));
    }
    Err(ApiError::new(
        RuntimeCode::ModelNotLoaded,
        format!("not ready: enabled models not loaded: {}", waiting.join(", ")),
    ))
}

/// `GET /v2/models/{name}/ready`: 200 with an empty body when loaded; 400 when configured
/// and not loaded (Triton's answer for not ready); 404 when not configured.
/// While keys are set, a caller without one is told the state, not the error text.
pub(crate) async fn model_ready(ctx: Ctx) -> Result<Response, ApiError> {
    let disclose = crate::auth::discloses(&ctx.state.options, &ctx.headers);
    match readiness(&ctx.state.manager, ctx.name(), disclose)? {
        Ok(()) => Ok(empty_response(StatusCode::OK)),
        Err(why) => Err(ApiError::new(HttpCode::ModelNotReady, why)),
    }
}

/// `POST /v2/repository/index`: every configured model with its state, or only the ready
/// ones with `ready: true`.
pub(crate) async fn index(ctx: Ctx) -> Result<Response, ApiError> {
    let body: IndexBody = parse_json(&ctx.body, true)?;
    let rows = index_entries(&ctx.state.manager, body.ready.unwrap_or(false), ctx.caller).await;
    Ok(json_response(StatusCode::OK, &rows))
}

/// `POST /v2/repository/models/{name}/load`: load, or reload with `parameters.config`.
pub(crate) async fn load(ctx: Ctx) -> Result<Response, ApiError> {
    // An unknown model is refused before the body is read.
    known(&ctx.state.manager, ctx.name()).await?;
    let body: LoadBody = parse_json(&ctx.body, true)?;
    let parameters = body.parameters.unwrap_or_default();
    load_model(&ctx.state.manager, ctx.name(), parameters, ctx.caller).await?;
    Ok(empty_object())
}

/// `POST /v2/repository/models/{name}/unload`: graceful unload.
pub(crate) async fn unload(ctx: Ctx) -> Result<Response, ApiError> {
    let body: UnloadBody = parse_json(&ctx.body, true)?;
    let parameters = body.parameters.unwrap_or_default();
    unload_model(&ctx.state.manager, ctx.name(), parameters, ctx.caller).await?;
    Ok(empty_object())
}

/// 400 for `file:` parameters and for parameters the route does not know.
fn refuse_other_parameters(other: &Map<String, Value>, accepted: &[&str]) -> Result<(), ApiError> {
    if let Some(key) = other.keys().find(|k| k.starts_with(FILE_PARAMETER_PREFIX)) {
        return Err(ApiError::bad_request(format!(
            "parameter `{key}` is refused: model files cannot be uploaded; models are defined in \
             Hangar's config, and `parameters.config` only overrides runtime settings"
        )));
    }
    if let Some(key) = other.keys().next() {
        let accepted: Vec<String> = accepted.iter().map(|a| format!("`{a}`")).collect();
        return Err(ApiError::bad_request(format!(
            "unknown parameter `{key}`; accepted: {}",
            accepted.join(", ")
        )));
    }
    Ok(())
}

/// The override patch of `parameters.config`: `None` when absent or `null`.
///
/// # Errors
/// 400 when it is neither an object nor a string holding one, or names another model.
fn config_patch(name: &str, config: Option<Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let patch = match config {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(patch)) => patch,
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(patch)) => patch,
            Ok(other) => {
                return Err(ApiError::bad_request(format!(
                    "parameters.config must hold a JSON object, got {}",
                    hangar_config::json_kind(&other)
                )));
            }
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "parameters.config is not valid JSON: {e}"
                )));
            }
        },
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "parameters.config must be a JSON object or a string holding one, got {}",
                hangar_config::json_kind(&other)
            )));
        }
    };
    let mut value = Value::Object(patch);
    crate::body::integral_floats_to_integers(&mut value);
    let Value::Object(mut patch) = value else { return Ok(None) };
    // Triton configs carry the model's name; it identifies the model, it overrides nothing.
    match patch.remove("name") {
        None => {}
        Some(Value::String(n)) if n == name => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "parameters.config names model {other}, but the request is for '{name}'"
            )));
        }
    }
    Ok(Some(patch))
}
