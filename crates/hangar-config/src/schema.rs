//! The JSON Schema of the merged config, assembled from the same types the validator uses.

use serde_json::{Map, Value, json};

use crate::config::SettingsFields;
use crate::kinds::BackendKind;
use crate::name::ModelName;
use crate::validate::{MODEL_SECTIONS, inline_schema};

/// JSON Schema (draft 2020-12) of a merged config (`settings.json` with `local.json`
/// applied). Each model is one of the per-backend shapes: the common fields plus the
/// fields of that backend, nothing else.
pub fn config_schema() -> Value {
    let mut root = inline_schema::<SettingsFields>();
    root.insert("title".into(), "Hangar config (settings.json merged with local.json)".into());
    let per_backend: Vec<Value> = BackendKind::ALL.iter().map(|&b| model_schema(b)).collect();
    let name_schema = Value::from(inline_schema::<ModelName>());
    let models = json!({
        "description": "The configured models, by name. A model set to null (e.g. in local.json) is removed.",
        "type": ["object", "null"],
        "propertyNames": name_schema,
        "additionalProperties": { "oneOf": [ { "oneOf": per_backend }, { "type": "null" } ] }
    });
    if let Some(Value::Object(props)) = root.get_mut("properties") {
        props.insert("models".into(), models);
    }
    Value::Object(root)
}

/// The schema of one model whose `backend` is `backend`.
fn model_schema(backend: BackendKind) -> Value {
    let mut properties = Map::new();
    for section in MODEL_SECTIONS.iter().filter(|s| s.backends.contains(&backend)) {
        properties.extend(section.properties.clone());
    }
    properties.insert(
        "backend".into(),
        json!({ "const": backend.as_str(), "description": "The engine that runs the model." }),
    );
    json!({
        "title": backend.as_str(),
        "type": "object",
        "required": ["backend"],
        "properties": properties,
        "additionalProperties": false
    })
}
