//! `GET /openapi.json`: the OpenAPI 3.1 document, generated once per service.
//!
//! Nothing is written per route: every operation comes from the route table ([`routes`]);
//! every request body, query, success answer and error envelope from the schemars types the
//! handlers use, through one [`SchemaGenerator`] whose `$ref`s point at
//! `#/components/schemas/…`; every error status from the route's error codes through
//! [`ErrorCode::status`]. `security` is declared exactly on the routes that need a key — the
//! admin key, or an inference key — and only when one of that class is configured.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use hangar_runtime::ModelState;
use http::StatusCode;
use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use schemars::{Schema, SchemaGenerator};
use serde_json::{Map, Value, json};
use strum::IntoEnumIterator;

use crate::body::Response;
use crate::error::{ApiError, ErrorBody, ErrorCode, HttpCode, RuntimeCode, V2ErrorBody};
use crate::health::{OPENMETRICS_TEXT, PROMETHEUS_TEXT};
use crate::router::{Auth, Ctx, ExampleModels, Group, Route, SchemaFn, Success, routes};

/// Where component schemas live; the generator's `$ref`s point here.
const SCHEMAS_PATH: &str = "/components/schemas";

/// The name of the admin security scheme.
const BEARER_AUTH: &str = "bearerAuth";
/// The name of the inference security scheme.
const INFERENCE_AUTH: &str = "inferenceBearerAuth";

/// Which classes of keys the service has configured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Keys {
    /// An admin key.
    pub(crate) admin: bool,
    /// At least one inference key.
    pub(crate) inference: bool,
    /// `http.metrics_require_key`.
    pub(crate) metrics: bool,
}

impl Keys {
    /// Whether a route of class `auth` is keyed like an inference route: inference routes
    /// always, `/metrics` when the operator asks.
    fn metrics(self, auth: Auth) -> bool {
        auth != Auth::Metrics || self.metrics
    }

    /// The security requirements of a route of class `auth` (empty: open).
    fn requirements(self, auth: Auth) -> Vec<Value> {
        match auth {
            Auth::Admin if self.admin => vec![json!({ BEARER_AUTH: [] })],
            Auth::Inference | Auth::Metrics
                if self.inference && self.admin && self.metrics(auth) =>
            {
                vec![json!({ INFERENCE_AUTH: [] }), json!({ BEARER_AUTH: [] })]
            }
            Auth::Inference | Auth::Metrics if self.inference && self.metrics(auth) => {
                vec![json!({ INFERENCE_AUTH: [] })]
            }
            _ => Vec::new(),
        }
    }
}

/// `GET /openapi.json`.
pub(crate) async fn document(ctx: Ctx) -> Result<Response, ApiError> {
    Ok(crate::body::bytes_response(StatusCode::OK, "application/json", ctx.state.openapi.clone()))
}

/// The whole document for a service with these `keys`, encoded.
pub(crate) fn encoded(keys: Keys, examples: &ExampleModels) -> Bytes {
    Bytes::from(serde_json::to_vec(&build(keys, examples)).unwrap_or_default())
}

/// The whole document; request examples name the models of `examples`.
pub(crate) fn build(keys: Keys, examples: &ExampleModels) -> Value {
    let settings = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = SCHEMAS_PATH.into();
            s.meta_schema = None;
        })
        .with_transform(RecursiveTransform(integer_bounds));
    let mut generator = settings.into_generator();
    let envelopes = Envelopes {
        json: generator.subschema_for::<ErrorBody>().to_value(),
        v2: generator.subschema_for::<V2ErrorBody>().to_value(),
        anthropic: generator.subschema_for::<crate::anthropic::types::ErrorEnvelope>().to_value(),
    };
    let mut paths = Map::new();
    let mut ids = BTreeSet::new();
    for route in routes() {
        let mut op = operation(route, &mut generator, &envelopes, keys, &mut ids);
        if let Some(example) = route.example.and_then(|f| f(examples)) {
            op["requestBody"]["content"]["application/json"]["example"] = example;
        }
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method.as_str().to_ascii_lowercase()] = op;
    }
    let model_state = generator.subschema_for::<crate::wire::ModelState>();
    generator.subschema_for::<ErrorCode>();
    let mut schemas = generator.take_definitions(true);
    for schema in schemas.values_mut() {
        if let Some(obj) = schema.as_object_mut() {
            obj.remove("$schema");
        }
    }
    if let Some(state) = component_mut(&mut schemas, &model_state) {
        describe_states(state);
    }
    let mut components = json!({ "schemas": schemas });
    let mut schemes = Map::new();
    if keys.admin {
        schemes.insert(BEARER_AUTH.into(), json!({
            "type": "http",
            "scheme": "bearer",
            "description": "The admin API key (`admin_api_key` in the config, `--admin-api-key` or `HANGAR_ADMIN_KEY`), as `Authorization: Bearer <key>`. A missing header answers 401 `unauthorized`, a wrong key 403 `forbidden`. It opens the inference routes too.",
        }));
    }
    if keys.inference {
        schemes.insert(INFERENCE_AUTH.into(), json!({
            "type": "http",
            "scheme": "bearer",
            "description": "One of the inference API keys (`inference_api_keys` in the config, `--inference-api-key` or `HANGAR_INFERENCE_KEYS`), as `Authorization: Bearer <key>`. A missing header answers 401 `unauthorized`, a wrong key 403 `forbidden`. An inference key never opens an admin route.",
        }));
    }
    if !schemes.is_empty() {
        components["securitySchemes"] = schemes.into();
    }
    let tags: Vec<Value> = Group::iter()
        .map(|g| json!({ "name": <&str>::from(g), "description": group_description(g) }))
        .collect();
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
                "Admin routes need `Authorization: Bearer <admin key>` when an admin key is configured, ",
                "inference routes an inference key (or the admin key) when inference keys are configured; ",
                "this document declares `security` on them exactly then.",
            ),
            "license": { "name": env!("CARGO_PKG_LICENSE") },
        },
        "tags": tags,
        "paths": paths,
        "components": components,
    })
}

/// Gives integer schemas the bounds of their Rust type (`format: uint32` and the like), so
/// the document accepts exactly the integers the server does.
fn integer_bounds(schema: &mut Schema) {
    let (min, max): (i128, i128) = match schema.get("format").and_then(Value::as_str) {
        Some("uint8") => (0, u8::MAX.into()),
        Some("uint16") => (0, u16::MAX.into()),
        Some("uint32") => (0, u32::MAX.into()),
        Some("uint64" | "uint") => (0, u64::MAX.into()),
        Some("int8") => (i8::MIN.into(), i8::MAX.into()),
        Some("int16") => (i16::MIN.into(), i16::MAX.into()),
        Some("int32") => (i32::MIN.into(), i32::MAX.into()),
        Some("int64" | "int") => (i64::MIN.into(), i64::MAX.into()),
        _ => return,
    };
    let number =
        |n: i128| u64::try_from(n).map(Value::from).unwrap_or_else(|_| Value::from(n as i64));
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("minimum").or_insert_with(|| number(min));
        obj.entry("maximum").or_insert_with(|| number(max));
    }
}

/// `$ref`s to the error envelopes.
struct Envelopes {
    json: Value,
    v2: Value,
    anthropic: Value,
}

/// The operation object of one route.
fn operation(
    route: &Route,
    generator: &mut SchemaGenerator,
    envelopes: &Envelopes,
    keys: Keys,
    ids: &mut BTreeSet<String>,
) -> Value {
    let security = keys.requirements(route.auth);
    let secured = !security.is_empty();
    let mut op = Map::new();
    op.insert("operationId".into(), unique_id(operation_id(route), ids).into());
    op.insert("summary".into(), route.summary.into());
    let mut description = route.description.to_owned();
    description.push_str(match (route.auth, secured) {
        (Auth::Admin, true) => "\n\nAdmin route: requires `Authorization: Bearer <admin key>` (401 without it, 403 with a wrong key).",
        (Auth::Admin, false) => "\n\nAdmin route: open, as no admin key is configured.",
        (Auth::Inference | Auth::Metrics, true) => "\n\nInference route: requires `Authorization: Bearer <inference key or admin key>` (401 without it, 403 with a wrong key).",
        _ => "",
    });
    op.insert("description".into(), description.into());
    op.insert("tags".into(), json!([<&str>::from(route.group)]));

    let mut parameters: Vec<Value> =
        path_params(route.path).iter().map(|p| path_parameter(p)).collect();
    if let Some(query) = route.query {
        parameters.extend(query_parameters(generator, query));
    }
    if !parameters.is_empty() {
        op.insert("parameters".into(), parameters.into());
    }
    if let Some((schema, optional)) = route.body {
        let schema = schema(generator).to_value();
        op.insert(
            "requestBody".into(),
            json!({ "required": !optional, "content": { "application/json": { "schema": schema } } }),
        );
    }

    let mut responses = Map::new();
    responses.insert("200".into(), success(route, generator));
    if let Some((status, schema)) = route.other {
        let schema = schema(generator).to_value();
        responses.insert(
            status.as_str().into(),
            json!({ "description": "Not ready.", "content": { "application/json": { "schema": schema } } }),
        );
    }
    let envelope = match route.group {
        Group::Repository => &envelopes.v2,
        Group::Anthropic => &envelopes.anthropic,
        _ => &envelopes.json,
    };
    for (status, codes) in error_statuses(route, secured) {
        let list: Vec<String> = codes.iter().map(|c| format!("`{}`", c.as_str())).collect();
        let description =
            format!("{}: {}.", status.canonical_reason().unwrap_or("Error"), list.join(", "));
        responses.insert(
            status.as_str().into(),
            json!({ "description": description, "content": { "application/json": { "schema": envelope } } }),
        );
    }
    op.insert("responses".into(), responses.into());
    if secured {
        op.insert("security".into(), security.into());
    }
    Value::Object(op)
}

/// The error codes a route answers with, by status: its own, plus the auth and body codes
/// its table entry implies.
fn error_statuses(route: &Route, secured: bool) -> BTreeMap<StatusCode, Vec<ErrorCode>> {
    let mut codes: Vec<ErrorCode> = route.errors.to_vec();
    // The browser rules apply before routing, to every route.
    codes.extend([HttpCode::OriginNotAllowed, HttpCode::HostNotAllowed].map(ErrorCode::Http));
    // So does the listeners' gate, to a call let in without a key while keys are set.
    codes.push(HttpCode::TooManyKeylessCalls.into());
    if secured {
        codes.extend([HttpCode::Unauthorized, HttpCode::Forbidden].map(ErrorCode::Http));
    }
    if route.body.is_some() {
        codes.extend::<[ErrorCode; 4]>([
            HttpCode::PayloadTooLarge.into(),
            RuntimeCode::InvalidRequestBody.into(),
            HttpCode::BodyTimeout.into(),
            HttpCode::RequestBodiesFull.into(),
        ]);
    }
    let mut by_status: BTreeMap<StatusCode, Vec<ErrorCode>> = BTreeMap::new();
    for code in codes {
        by_status.entry(code.status()).or_default().push(code);
    }
    by_status
}

/// The `200` response of a route.
fn success(route: &Route, generator: &mut SchemaGenerator) -> Value {
    let json_content = |schema: SchemaFn, generator: &mut SchemaGenerator| json!({ "application/json": { "schema": schema(generator).to_value() } });
    match route.success {
        Success::Json(schema) => {
            json!({ "description": "Success.", "content": json_content(schema, generator) })
        }
        Success::JsonOrEvents(schema, event) => {
            let mut content = json_content(schema, generator);
            content["text/event-stream"] = event_stream(
                event(generator).to_value(),
                "With `stream: true` (or `follow=true`): server-sent events, each `data:` line one JSON event (chat and completion streams end with `data: [DONE]`).",
            );
            json!({ "description": "Success; a JSON body, or an event stream with `stream: true`.", "content": content })
        }
        Success::Events(event) => {
            let stream = event_stream(
                event(generator).to_value(),
                "Server-sent events, each `data:` line one JSON event.",
            );
            json!({ "description": "Success: an event stream.", "content": { "text/event-stream": stream } })
        }
        Success::Metrics => {
            let text = json!({ "schema": { "type": "string", "description": "Prometheus text exposition format." } });
            json!({ "description": "Success.", "content": { PROMETHEUS_TEXT: text.clone(), OPENMETRICS_TEXT: text } })
        }
        Success::Html => {
            let page = json!({ "schema": { "type": "string", "description": "An HTML page." } });
            json!({ "description": "Success.", "content": { "text/html": page } })
        }
        Success::Text => {
            let text = json!({ "schema": { "type": "string" } });
            let content = json!({ "text/javascript": text.clone(), "text/css": text.clone(), "image/svg+xml": text });
            json!({ "description": "Success.", "content": content })
        }
        Success::Empty => json!({ "description": "Success, with an empty body." }),
    }
}

/// A `text/event-stream` media type: per OpenAPI 3.1 practice (3.2's `itemSchema`), the
/// schema is that of one parsed event — `data` a string holding JSON of the `event` schema
/// (`contentMediaType` / `contentSchema`), `event`, `id` and `retry` as the SSE fields —
/// which is how validators such as schemathesis check each event of a stream. The event's
/// schema is repeated as `x-event-schema` for readers.
fn event_stream(event: Value, description: &str) -> Value {
    json!({
        "schema": {
            "type": "object",
            "description": description,
            "required": ["data"],
            "properties": {
                "data": { "type": "string", "contentMediaType": "application/json", "contentSchema": event },
                "event": { "type": "string" },
                "id": { "type": "string" },
                "retry": { "type": "integer", "minimum": 0 },
            },
        },
        "x-event-schema": event,
    })
}

/// Query parameters from an object schema's properties.
fn query_parameters(generator: &mut SchemaGenerator, query: SchemaFn) -> Vec<Value> {
    let schema = query(generator);
    let resolved = resolve(generator, &schema).cloned().unwrap_or_default();
    let properties =
        resolved.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    properties
        .into_iter()
        .map(|(name, mut schema)| {
            let description = schema
                .as_object_mut()
                .and_then(|s| s.remove("description"))
                .unwrap_or_else(|| format!("The `{name}` filter.").into());
            json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
        })
        .collect()
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

/// Gives every [`ModelState`] variant a `title`: its one-line description.
fn describe_states(schema: &mut Map<String, Value>) {
    let Some(Value::Array(entries)) = schema.get_mut("oneOf") else { return };
    for entry in entries {
        let Some(state) = entry.get("const").and_then(Value::as_str) else { continue };
        if let Some(state) = ModelState::ALL.into_iter().find(|s| s.as_str() == state) {
            entry["title"] = state.description().into();
        }
    }
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
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string", "minLength": 1 } })
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
        Group::Anthropic => {
            "Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over the same \
             models and state rules as the OpenAI routes. Takes `x-api-key` as well as the bearer \
             key. Errors use Anthropic's envelope `{\"type\": \"error\", \"error\": {\"type\", \
             \"message\", \"code\"}}`, with Hangar's code in `code`."
        }
        Group::MultiModel => {
            "Multi-model operations (`/api/v1/…`, Lemonade-style): health with every loaded model, \
             last-request stats, load with least-recently-used eviction, unload."
        }
        Group::Repository => {
            "KServe v2 / Triton server metadata, health and model repository (`/v2/…`). Errors use the \
             v2 envelope `{\"error\": \"message\"}`."
        }
        Group::WeightControl => {
            "SGLang's weight-control paths at the root (`/model_info`, `/pause_generation`, \
             `/continue_generation`, `/update_weights_from_disk`, `/weights_checker`) with its bodies \
             plus an optional `model`, needed only when more than one model is loaded. Answers carry \
             `success` and `message`. Requires the admin key when one is configured."
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
    fn references_point_at_components() {
        assert_eq!(component_name("#/components/schemas/ModelState"), Some("ModelState"));
        assert_eq!(component_name("#/$defs/ModelState"), None);
    }

    #[test]
    fn error_statuses_come_from_the_codes() {
        let load = routes().iter().find(|r| r.path == "/v1/admin/models/{name}/load").unwrap();
        let statuses: Vec<u16> = error_statuses(load, true).keys().map(|s| s.as_u16()).collect();
        assert_eq!(statuses, [400, 401, 403, 404, 408, 409, 413, 422, 429, 503, 507]);
        let open: Vec<u16> = error_statuses(load, false).keys().map(|s| s.as_u16()).collect();
        assert_eq!(open, [400, 403, 404, 408, 409, 413, 422, 429, 503, 507]);
    }
}
