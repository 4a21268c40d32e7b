//! `GET /openapi.json`: the OpenAPI 3.1 document.
//!
//! Generated, never written per route: every operation comes from the route table
//! ([`routes`]) and every schema from the schemars types the handlers use, through one
//! [`SchemaGenerator`] whose `$ref`s point at `#/components/schemas/…`. The only prose here
//! is per API group, per error envelope and per HTTP-layer error code.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use hangar_lifecycle::ModelState;
use hangar_runtime::ModelSnapshot;
use http::StatusCode;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::body::{Response, json_response};
use crate::error::{ApiError, codes};
use crate::router::{Ctx, Group, Route, routes};

/// Where component schemas live; the generator's `$ref`s point here.
const SCHEMAS_PATH: &str = "/components/schemas";

/// The name of the admin security scheme.
const BEARER_AUTH: &str = "bearerAuth";

/// The route answering Prometheus text rather than JSON.
const METRICS_PATH: &str = "/metrics";

/// Every group, in the order the tags are listed.
const GROUPS: [Group; 5] =
    [Group::Admin, Group::Inference, Group::MultiModel, Group::Repository, Group::Operations];

/// The codes the HTTP layer itself produces (see [`codes`]), next to the control plane's
/// [`hangar_runtime::ErrorCode`].
const HTTP_CODES: [(&str, &str); 10] = [
    (codes::NOT_FOUND, "No route matches the request path (404)."),
    (codes::METHOD_NOT_ALLOWED, "The path exists, but not with this method (405)."),
    (
        codes::PAYLOAD_TOO_LARGE,
        "The request body exceeds the configured `max_request_body_bytes` (413).",
    ),
    (
        codes::INVALID_REQUEST_BODY,
        "The request body is not valid JSON or does not match the request schema (422); the message carries the parser's line and column, `field` names the offending field when one is to blame.",
    ),
    (
        codes::INVALID_REQUEST,
        "The request is not valid: a malformed parameter or a value the route does not accept (400).",
    ),
    (
        codes::UNAUTHORIZED,
        "An admin route was called without `Authorization: Bearer <admin key>` while an admin key is configured (401).",
    ),
    (codes::FORBIDDEN, "The admin key given is not the configured one (403)."),
    (
        codes::THINKING_UNSUPPORTED,
        "The requested `thinking` mode is not one of the model's `capabilities.thinking_modes` (400).",
    ),
    (
        codes::INVALID_LOAD_REQUEST,
        "Load options are well-formed but wrong for the model's backend or state, e.g. options sent to a model that is already loaded (400).",
    ),
    (
        codes::MODEL_NOT_LOADED,
        "The model is not loaded; requests are admitted only while it is loaded (503).",
    ),
];

/// The error envelope of every route outside the KServe v2 model repository.
#[derive(JsonSchema)]
#[allow(dead_code)] // schema only: `ApiError::into_response` writes the envelope
struct ErrorEnvelope {
    /// What went wrong.
    error: ErrorDetail,
}

/// The `error` object of an error response.
#[derive(JsonSchema)]
#[allow(dead_code)] // schema only
struct ErrorDetail {
    /// Machine-readable snake_case code.
    code: hangar_runtime::ErrorCode,
    /// Human-readable message.
    message: String,
    /// With `load_failed`: the model after the failed load, `last_error` saying why.
    model: Option<ModelSnapshot>,
    /// With `invalid_request_body` / `invalid_load_request`: the offending field.
    field: Option<String>,
    /// With a 409 conflict: the model's state that does not allow the operation.
    runtime_state: Option<ModelState>,
}

/// The KServe v2 error envelope of the model-repository routes.
#[derive(JsonSchema)]
#[allow(dead_code)] // schema only: `ApiError::into_v2_response` writes the envelope
struct V2ErrorEnvelope {
    /// Human-readable message.
    error: String,
}

static DOCUMENT: LazyLock<Value> = LazyLock::new(build);

/// `GET /openapi.json`.
pub(crate) async fn document(_ctx: Ctx) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &*DOCUMENT))
}

/// Builds the whole document.
fn build() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = SCHEMAS_PATH.into();
        s.meta_schema = None;
    });
    let mut generator = settings.into_generator();
    let shared = Shared {
        envelope: generator.subschema_for::<ErrorEnvelope>().to_value(),
        v2_envelope: generator.subschema_for::<V2ErrorEnvelope>().to_value(),
    };

    let mut paths = Map::new();
    let mut operation_ids = BTreeSet::new();
    for route in routes() {
        let op = operation(route, &mut generator, &shared, &mut operation_ids);
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method.as_str().to_ascii_lowercase()] = op;
    }

    let model_state = generator.subschema_for::<ModelState>();
    let error_code = generator.subschema_for::<hangar_runtime::ErrorCode>();
    let mut schemas = generator.take_definitions(true);
    for schema in schemas.values_mut() {
        if let Some(obj) = schema.as_object_mut() {
            obj.remove("$schema");
        }
    }
    if let Some(state) = component_mut(&mut schemas, &model_state) {
        describe_states(state);
    }
    if let Some(code) = component_mut(&mut schemas, &error_code) {
        add_http_codes(code);
    }

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Hangar",
            "version": env!("CARGO_PKG_VERSION"),
            "description": concat!(
                "Hangar manages LLM serving runtimes: it loads and unloads configured models on demand ",
                "and serves them through OpenAI-compatible, multi-model and KServe v2 APIs.\n\n",
                "Every model has a live runtime state (`ModelState`: unloaded, loading, loaded, unloading, failed), ",
                "kept apart from its configured definition. Errors answer with the envelope ",
                "`{\"error\": {\"code\", \"message\"}}` whose `code` is one of `ErrorCode`; the KServe v2 ",
                "model-repository routes answer `{\"error\": \"message\"}` instead.\n\n",
                "Admin routes need `Authorization: Bearer <admin key>` when an admin key is configured.",
            ),
            "license": { "name": env!("CARGO_PKG_LICENSE") },
        },
        "tags": GROUPS.iter().map(|g| json!({ "name": g.tag(), "description": group_description(*g) })).collect::<Vec<_>>(),
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                BEARER_AUTH: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin API key (`admin_api_key` in the config), as `Authorization: Bearer <key>`. \
                        Required by admin routes only when an admin key is configured; without one they are open. \
                        A missing header answers 401 `unauthorized`, a wrong key 403 `forbidden`.",
                },
            },
        },
    })
}

/// `$ref`s to the error envelopes.
struct Shared {
    envelope: Value,
    v2_envelope: Value,
}

/// The operation object of one route.
fn operation(
    route: &Route,
    generator: &mut SchemaGenerator,
    shared: &Shared,
    ids: &mut BTreeSet<String>,
) -> Value {
    let mut op = Map::new();
    op.insert("operationId".into(), unique_id(operation_id(route), ids).into());
    op.insert("summary".into(), route.summary.into());
    let mut description = route.description.to_owned();
    if route.admin {
        description.push_str(
            "\n\nAdmin route: when an admin key is configured it requires `Authorization: Bearer <admin key>` \
             (401 without it, 403 with a wrong key); without one it is open.",
        );
    }
    op.insert("description".into(), description.into());
    op.insert("tags".into(), json!([route.group.tag()]));

    let params = path_params(route.path);
    if !params.is_empty() {
        let params: Vec<Value> = params.iter().map(|p| path_parameter(p)).collect();
        op.insert("parameters".into(), params.into());
    }

    let mut streams = false;
    if let Some(request) = route.request {
        let schema = request(generator);
        let resolved = resolve(generator, &schema);
        // A body whose schema requires nothing may be left out (it reads as `{}`).
        let required = resolved
            .and_then(|s| s.get("required"))
            .and_then(Value::as_array)
            .is_some_and(|r| !r.is_empty());
        streams = route.group == Group::Inference
            && resolved.and_then(|s| s.get("properties")).and_then(|p| p.get("stream")).is_some();
        op.insert(
            "requestBody".into(),
            json!({
                "required": required,
                "content": { "application/json": { "schema": schema.to_value() } },
            }),
        );
    }

    let mut responses = Map::new();
    responses.insert("200".into(), success(route, generator, streams));
    let envelope =
        if route.group == Group::Repository { &shared.v2_envelope } else { &shared.envelope };
    let mut error = |status: &str, description: &str| {
        responses.insert(
            status.into(),
            json!({ "description": description, "content": { "application/json": { "schema": envelope } } }),
        );
    };
    let inference = route.group == Group::Inference && route.request.is_some();
    if inference {
        error(
            "400",
            "The request is not valid for the model (`invalid_request`, `unsupported`, `thinking_unsupported`).",
        );
    }
    if route.admin {
        error(
            "401",
            "No `Authorization: Bearer <admin key>` while an admin key is configured (`unauthorized`).",
        );
        error("403", "The admin key is not valid (`forbidden`).");
    }
    if !params.is_empty() || inference {
        error("404", "The model is not configured (`unknown_model`).");
    }
    if route.request.is_some() {
        error("413", "The request body exceeds `max_request_body_bytes` (`payload_too_large`).");
        error(
            "422",
            "The request body is not valid JSON or fails the request schema (`invalid_request_body`).",
        );
    }
    if inference {
        error("429", "The model's request queue is full (`queue_full`).");
        error(
            "503",
            "The model is not serving: `model_not_loaded`, `model_loading`, `model_unloading` or `model_failed`.",
        );
    }
    error("default", "An error, with its code and message.");
    op.insert("responses".into(), responses.into());

    if route.admin {
        op.insert("security".into(), json!([{ BEARER_AUTH: [] }]));
    }
    Value::Object(op)
}

/// The `200` response of a route.
fn success(route: &Route, generator: &mut SchemaGenerator, streams: bool) -> Value {
    let mut content = Map::new();
    if route.path == METRICS_PATH {
        content.insert(
            "text/plain".into(),
            json!({ "schema": { "type": "string", "description": "Prometheus text exposition format 0.0.4." } }),
        );
    } else {
        let schema = match route.response {
            Some(response) => response(generator).to_value(),
            None => json!({ "type": "object" }),
        };
        content.insert("application/json".into(), json!({ "schema": schema }));
    }
    if streams {
        content.insert(
            "text/event-stream".into(),
            json!({
                "schema": {
                    "type": "string",
                    "description": "With `stream: true`: server-sent events, one `data: <JSON chunk>` per event, ending with `data: [DONE]`.",
                },
            }),
        );
    }
    let description = if streams {
        "Success; a JSON body, or an event stream with `stream: true`."
    } else {
        "Success."
    };
    json!({ "description": description, "content": content })
}

/// The schema a `$ref` points at (or the schema itself when it is not a reference).
fn resolve<'a>(
    generator: &'a SchemaGenerator,
    schema: &'a Schema,
) -> Option<&'a Map<String, Value>> {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => generator.definitions().get(component_name(reference)?)?.as_object(),
        None => schema.as_object(),
    }
}

/// The component name of a `#/components/schemas/…` reference.
fn component_name(reference: &str) -> Option<&str> {
    reference.strip_prefix('#')?.strip_prefix(SCHEMAS_PATH)?.strip_prefix('/')
}

/// The component a generated reference points at.
fn component_mut<'a>(
    schemas: &'a mut Map<String, Value>,
    reference: &Schema,
) -> Option<&'a mut Map<String, Value>> {
    let name = component_name(reference.get("$ref")?.as_str()?)?;
    schemas.get_mut(name)?.as_object_mut()
}

/// Takes a string-enum schema's variants as `{const, description}` entries (schemars
/// writes `oneOf` when the variants have docs, a plain `enum` otherwise); [`put_one_of`]
/// puts them back.
fn take_one_of(schema: &mut Map<String, Value>) -> Vec<Value> {
    let mut entries = match schema.remove("oneOf") {
        Some(Value::Array(entries)) => entries,
        _ => Vec::new(),
    };
    if let Some(Value::Array(values)) = schema.remove("enum") {
        entries.extend(values.into_iter().map(|v| json!({ "type": "string", "const": v })));
    }
    schema.remove("type");
    entries
}

fn put_one_of(schema: &mut Map<String, Value>, entries: Vec<Value>) {
    schema.insert("oneOf".into(), Value::Array(entries));
}

/// Edits the entry for `value`, added when missing.
fn edit_entry(entries: &mut Vec<Value>, value: &str, edit: impl FnOnce(&mut Map<String, Value>)) {
    let found = entries.iter_mut().find(|e| e.get("const").and_then(Value::as_str) == Some(value));
    match found.and_then(Value::as_object_mut) {
        Some(entry) => edit(entry),
        None => {
            let mut entry = Map::new();
            entry.insert("type".into(), "string".into());
            entry.insert("const".into(), value.into());
            edit(&mut entry);
            entries.push(Value::Object(entry));
        }
    }
}

/// Gives every [`ModelState`] an entry with a `title` (its one-line description) and a
/// `description` (its doc comment, or the one-liner when there is none).
fn describe_states(schema: &mut Map<String, Value>) {
    let mut entries = take_one_of(schema);
    for state in ModelState::ALL {
        edit_entry(&mut entries, state.as_str(), |entry| {
            entry.insert("title".into(), state.description().into());
            entry.entry("description").or_insert_with(|| state.description().into());
        });
    }
    put_one_of(schema, entries);
}

/// Adds the HTTP layer's codes to the control plane's `ErrorCode`.
fn add_http_codes(schema: &mut Map<String, Value>) {
    schema.insert(
        "description".into(),
        "Every machine-readable error code: the control plane's (also the `outcome` label of metrics) \
         and the HTTP layer's."
            .into(),
    );
    let mut entries = take_one_of(schema);
    for (code, description) in HTTP_CODES {
        edit_entry(&mut entries, code, |entry| {
            entry.entry("description").or_insert_with(|| description.into());
        });
    }
    put_one_of(schema, entries);
}

/// `{param}` names of a path, in order.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect()
}

/// The parameter object of a path parameter.
fn path_parameter(name: &str) -> Value {
    let description = match name {
        "name" => "The model's name as configured; percent-encode reserved characters (`qwen3%3A8b` for `qwen3:8b`).".to_owned(),
        other => format!("The `{other}` path parameter."),
    };
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" } })
}

/// `get_v1_admin_models_by_name`, from the method and the path.
fn operation_id(route: &Route) -> String {
    let mut id = route.method.as_str().to_ascii_lowercase();
    for segment in route.path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(param) => {
                id.push_str("by_");
                id.push_str(param);
            }
            None => id.extend(
                segment
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }),
            ),
        }
    }
    id
}

/// `id`, or `id_2`, `id_3`… when taken.
fn unique_id(id: String, taken: &mut BTreeSet<String>) -> String {
    let mut candidate = id.clone();
    let mut n = 2;
    while !taken.insert(candidate.clone()) {
        candidate = format!("{id}_{n}");
        n += 1;
    }
    candidate
}

/// The tag description of a group.
const fn group_description(group: Group) -> &'static str {
    match group {
        Group::Admin => {
            "Runtime administration (`/v1/admin/…`): every configured model with its live state, \
             load and unload, GPU memory. Requires the admin key when one is configured."
        }
        Group::Inference => {
            "OpenAI-compatible inference (`/v1/…`): responses, chat completions, completions, \
             embeddings, rerank, model list. Requests are admitted only while the model is loaded."
        }
        Group::MultiModel => {
            "Multi-model operations (`/api/v1/…`, Lemonade-style): health with every loaded model, \
             last-request stats, load with least-recently-used eviction, unload."
        }
        Group::Repository => {
            "KServe v2 / Triton server metadata, health and model repository (`/v2/…`). Errors use the \
             v2 envelope `{\"error\": \"message\"}`."
        }
        Group::Operations => {
            "Operations: Prometheus metrics, this document, liveness and readiness."
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_follow_method_and_path() {
        let id = |method: http::Method, path: &str| {
            let route =
                routes().iter().find(|r| r.method == method && r.path == path).expect("route");
            operation_id(route)
        };
        assert_eq!(
            id(http::Method::POST, "/v1/admin/models/{name}/load"),
            "post_v1_admin_models_by_name_load"
        );
        assert_eq!(id(http::Method::GET, "/v1/admin/gpu-memory"), "get_v1_admin_gpu_memory");
        assert_eq!(id(http::Method::GET, "/openapi.json"), "get_openapi_json");
        let mut taken = BTreeSet::new();
        assert_eq!(unique_id("a".into(), &mut taken), "a");
        assert_eq!(unique_id("a".into(), &mut taken), "a_2");
    }

    #[test]
    fn every_group_of_the_table_has_a_tag() {
        for route in routes() {
            assert!(GROUPS.contains(&route.group), "{} {}", route.method, route.path);
        }
    }

    #[test]
    fn references_point_at_components() {
        assert_eq!(component_name("#/components/schemas/ModelState"), Some("ModelState"));
        assert_eq!(component_name("#/$defs/ModelState"), None);
    }
}
