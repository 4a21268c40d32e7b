//! SGLang's own admin paths (`admin-control.md`): `/model_info`, `/pause_generation`,
//! `/continue_generation`, `/update_weights_from_disk`, `/weights_checker`, with SGLang's
//! bodies plus an optional `model` (needed only when more than one model is loaded), so RL
//! tooling written for SGLang works unchanged. Each calls the same runtime method as its
//! `/v1/admin/models/{name}/…` twin. The tensor and distributed update paths answer 501:
//! Hangar has no tensor data plane.
//!
//! Answers carry SGLang's `success` and `message`; a failure also carries the standard
//! `error` object, with the status of its code.

use hangar_runtime::{ModelSnapshot, WeightsAction};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admin::UpdateWeightsBody;
use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, ErrorBody, HttpCode, RuntimeCode};
use crate::router::Ctx;

/// `?model=` of the GET forms.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct ModelQuery {
    /// The model; needed only when more than one model is loaded.
    #[serde(default)]
    model: Option<String>,
}

/// A body that only names the model.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelBody {
    /// The model; needed only when more than one model is loaded.
    #[serde(default)]
    model: Option<String>,
}

/// Body of `POST /pause_generation`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseGenerationBody {
    /// The model; needed only when more than one model is loaded.
    #[serde(default)]
    model: Option<String>,
    /// `abort` (default), `retract` or `in_place`.
    #[serde(default)]
    mode: Option<crate::wire::PauseMode>,
}

/// Body of `POST /weights_checker`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WeightsCheckerBody {
    /// The model; needed only when more than one model is loaded.
    #[serde(default)]
    model: Option<String>,
    /// `checksum` (the default of the GET form), `snapshot`, `compare` or `reset_tensors`.
    action: crate::wire::WeightsAction,
}

/// `?model=&action=` of `GET /weights_checker`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct WeightsCheckerQuery {
    /// The model; needed only when more than one model is loaded.
    #[serde(default)]
    model: Option<String>,
    /// `checksum` (default) or `compare`; the other actions change state and answer 405
    /// here (use POST).
    #[serde(default)]
    #[schemars(with = "Option<ReadOnlyAction>")]
    action: Option<WeightsAction>,
}

/// The weights checker's actions that change nothing, the only ones of its `GET` form.
#[derive(Debug, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // A schema only: the query reads a `WeightsAction` and refuses the rest.
enum ReadOnlyAction {
    /// Digest every tensor.
    Checksum,
    /// Digest and compare with the snapshot.
    Compare,
}

/// `/model_info`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ModelInfo {
    /// The model's name in Hangar.
    pub(crate) model: String,
    /// The weights it runs on (or would load).
    pub(crate) model_path: Option<String>,
    /// Where its tokenizer comes from: the weights themselves for GGUF engines.
    pub(crate) tokenizer_path: Option<String>,
    /// Whether it generates text (an `llm`), as SGLang reports it.
    pub(crate) is_generation: bool,
    /// The weights' version label: what the last update set, `default` before any.
    pub(crate) weight_version: String,
    /// Its live state.
    pub(crate) runtime_state: crate::wire::ModelState,
    /// Whether it is paused.
    pub(crate) paused: bool,
}

/// SGLang's answer to a control call.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ControlResult {
    /// Whether it worked (always true in a 2xx answer).
    pub(crate) success: bool,
    /// What was done.
    pub(crate) message: String,
    /// After a weight update: the model's `weight_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight_version: Option<String>,
}

/// The weights checker's answer, SGLang-style.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CheckerResult {
    /// Always true in a 2xx answer.
    pub(crate) success: bool,
    /// What was done.
    pub(crate) message: String,
    /// The model.
    pub(crate) model: String,
    /// The digests, and for `compare` the differences.
    #[serde(flatten)]
    pub(crate) report: crate::wire::WeightsReport,
}

/// Runs `call`; a failure answers SGLang's `success: false` and `message` next to the
/// standard `error` object, with its code's status.
async fn sglang<F>(call: F) -> Response
where
    F: Future<Output = Result<Response, ApiError>>,
{
    call.await.unwrap_or_else(failure)
}

/// A failed control call: SGLang's fields next to the standard error envelope.
#[derive(Serialize)]
struct Failure {
    success: bool,
    message: String,
    #[serde(flatten)]
    envelope: ErrorBody,
}

fn failure(error: ApiError) -> Response {
    let body =
        Failure { success: false, message: error.message.clone(), envelope: error.to_body() };
    json_response(error.status(), &body)
}

fn info(s: &ModelSnapshot) -> ModelInfo {
    let model_path = s.weights_path.clone().or_else(|| s.config.model_path.clone());
    ModelInfo {
        model: s.name().to_owned(),
        tokenizer_path: model_path.clone(),
        model_path,
        is_generation: s.model_type == hangar_config::ModelType::Llm,
        weight_version: s.weight_version.clone().unwrap_or_else(|| "default".into()),
        runtime_state: s.runtime_state.into(),
        paused: s.pause.is_some(),
    }
}

fn ok(message: String, weight_version: Option<String>) -> Response {
    json_response(StatusCode::OK, &ControlResult { success: true, message, weight_version })
}

/// `GET /model_info`.
pub(crate) async fn model_info_get(ctx: Ctx) -> Response {
    sglang(async {
        let query: ModelQuery = ctx.query()?;
        let snapshot = ctx.state.manager.target_model(query.model.as_deref())?;
        Ok(json_response(StatusCode::OK, &info(&snapshot)))
    })
    .await
}

/// `POST /model_info`.
pub(crate) async fn model_info_post(ctx: Ctx) -> Response {
    sglang(async {
        let body: ModelBody = parse_json(&ctx.body, true)?;
        let snapshot = ctx.state.manager.target_model(body.model.as_deref())?;
        Ok(json_response(StatusCode::OK, &info(&snapshot)))
    })
    .await
}

/// `POST /pause_generation`.
pub(crate) async fn pause_generation(ctx: Ctx) -> Response {
    sglang(async {
        let body: PauseGenerationBody = parse_json(&ctx.body, true)?;
        let model = ctx.state.manager.target_model(body.model.as_deref())?;
        let mode = body.mode.unwrap_or_default();
        let snapshot = ctx.state.manager.pause(model.name(), mode.into()).await?;
        let mode: &str = mode.into();
        Ok(ok(format!("model '{}' paused with mode {mode}", snapshot.name()), None))
    })
    .await
}

/// `POST /continue_generation`.
pub(crate) async fn continue_generation(ctx: Ctx) -> Response {
    sglang(async {
        let body: ModelBody = parse_json(&ctx.body, true)?;
        let model = ctx.state.manager.target_model(body.model.as_deref())?;
        let snapshot = ctx.state.manager.resume(model.name()).await?;
        Ok(ok(format!("model '{}' continues", snapshot.name()), None))
    })
    .await
}

/// `POST /update_weights_from_disk`.
pub(crate) async fn update_weights_from_disk(ctx: Ctx) -> Response {
    sglang(async {
        let body: UpdateWeightsBody = parse_json(&ctx.body, false)?;
        let model = ctx.state.manager.target_model(body.model.as_deref())?;
        let update = body.update();
        let s = ctx.state.manager.update_weights_from_disk(model.name(), update).await?;
        let path = s.weights_path.clone().unwrap_or_default();
        let version = s.weight_version.clone().unwrap_or_else(|| "default".into());
        Ok(ok(format!("model '{}' now runs the weights of {path}", s.name()), Some(version)))
    })
    .await
}

/// `POST /weights_checker`.
pub(crate) async fn weights_checker_post(ctx: Ctx) -> Response {
    sglang(async {
        let body: WeightsCheckerBody = parse_json(&ctx.body, false)?;
        check(&ctx, body.model, body.action.into(), true).await
    })
    .await
}

/// `GET /weights_checker`: the read-only actions only. `snapshot` and `reset_tensors`
/// answer 405 `method_not_allowed`, and a `checksum` or `compare` that would pause the
/// loaded model 405 `would_pause`: a `GET` can be sent by any web page, so it changes
/// nothing (a decision recorded in docs/ARCHITECTURE.md).
pub(crate) async fn weights_checker_get(ctx: Ctx) -> Response {
    sglang(async {
        let query: WeightsCheckerQuery = ctx.query()?;
        let action = query.action.unwrap_or(WeightsAction::Checksum);
        if matches!(action, WeightsAction::Snapshot | WeightsAction::ResetTensors) {
            return Err(ApiError::new(
                HttpCode::MethodNotAllowed,
                "GET /weights_checker runs only the read-only actions (checksum, compare); \
                 snapshot and reset_tensors need POST /weights_checker",
            )
            .with_field("action"));
        }
        check(&ctx, query.model, action, false).await
    })
    .await
}

async fn check(
    ctx: &Ctx,
    model: Option<String>,
    action: WeightsAction,
    may_pause: bool,
) -> Result<Response, ApiError> {
    let model = ctx.state.manager.target_model(model.as_deref())?;
    let manager = &ctx.state.manager;
    let report = match may_pause {
        true => manager.check_weights(model.name(), action).await?,
        false => manager.check_weights_read_only(model.name(), action).await?,
    };
    let message = match &report.comparison {
        Some(c) if c.identical => "the weights match the snapshot".to_owned(),
        Some(c) => format!(
            "{} tensor(s) changed, {} missing, {} added since the snapshot",
            c.changed.len(),
            c.missing.len(),
            c.added.len()
        ),
        None => format!("checksum {}", report.digest.checksum),
    };
    let model = model.name().to_owned();
    Ok(json_response(
        StatusCode::OK,
        &CheckerResult { success: true, message, model, report: report.into() },
    ))
}

/// The four tensor and distributed update paths: 501.
pub(crate) async fn no_tensor_plane(_ctx: Ctx) -> Response {
    failure(ApiError::new(
        RuntimeCode::NotImplemented,
        "Hangar has no tensor data plane: tensor and distributed weight updates are not served; write the weights to disk and call /update_weights_from_disk",
    ))
}
