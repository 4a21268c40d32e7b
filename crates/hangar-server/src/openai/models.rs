//! `GET /v1/models` and `GET /v1/models/{name}`: configured models in OpenAI's format.

use hangar_config::ModelType;
use hangar_runtime::ModelSnapshot;

use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::embeddings::ListObject;
use super::{constant, unix_now};
use crate::body::{Response, json_response};
use crate::error::ApiError;
use crate::router::Ctx;
use crate::state::AppState;

constant!(
    /// `model`.
    ModelObjectType = "model"
);
constant!(
    /// `hangar`.
    Owner = "hangar"
);

/// One model in OpenAI's format, with its runtime state.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ModelObject {
    /// The model's name.
    id: String,
    /// Always `model`.
    object: ModelObjectType,
    /// When the service started, Unix seconds.
    created: u64,
    /// Always `hangar`.
    owned_by: Owner,
    /// The live state.
    runtime_state: crate::wire::ModelState,
    /// What it serves.
    #[serde(rename = "type")]
    model_type: ModelType,
}

/// The answer of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ModelList {
    /// Always `list`.
    object: ListObject,
    /// Every configured model.
    data: Vec<ModelObject>,
}

impl ModelObject {
    fn of(m: &ModelSnapshot, created: u64) -> Self {
        Self {
            id: m.name().to_owned(),
            object: ModelObjectType::Value,
            created,
            owned_by: Owner::Value,
            runtime_state: m.runtime_state.into(),
            model_type: m.model_type,
        }
    }
}

/// When the service started, in Unix seconds.
fn boot_time(state: &AppState) -> u64 {
    unix_now().saturating_sub(state.started.elapsed().as_secs())
}

/// `GET /v1/models`.
pub(crate) async fn list(ctx: Ctx) -> Result<Response, ApiError> {
    let created = boot_time(&ctx.state);
    let mut data = Vec::new();
    for m in ctx.state.manager.models() {
        let object = ModelObject::of(&m, created);
        // Each alias is listed as a model of its own, as clients pick names from this list.
        let aliases: Vec<ModelObject> = (m.config.aliases.iter())
            .map(|alias| ModelObject { id: alias.to_string(), ..object.clone() })
            .collect();
        data.push(object);
        data.extend(aliases);
    }
    Ok(json_response(StatusCode::OK, &ModelList { object: ListObject::Value, data }))
}

/// `GET /v1/models/{name}`.
pub(crate) async fn get(ctx: Ctx) -> Result<Response, ApiError> {
    let snapshot = ctx.state.manager.model(ctx.name())?;
    let object = ModelObject {
        id: ctx.name().to_owned(),
        ..ModelObject::of(&snapshot, boot_time(&ctx.state))
    };
    Ok(json_response(StatusCode::OK, &object))
}
