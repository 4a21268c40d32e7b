//! Routes as data (the table in `routes.rs` is also the source of the OpenAPI document)
//! and path matching with `matchit`, percent-decoding `{name}` parameters.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;

use crate::body::Response;
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

/// What a handler gets.
pub(crate) struct Ctx {
    pub(crate) state: Arc<AppState>,
    /// Path parameters, percent-decoded, in order.
    pub(crate) params: Vec<String>,
    /// The raw query string.
    pub(crate) query: Option<String>,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// Who the auth rules let in (the keyless local agent may do less).
    pub(crate) caller: crate::auth::Caller,
}

impl Ctx {
    /// The first path parameter (`{name}`).
    pub(crate) fn name(&self) -> &str {
        self.params.first().map_or("", String::as_str)
    }

    /// The query string parsed into `T`.
    ///
    /// # Errors
    /// 400 `invalid_request` naming the bad parameter.
    pub(crate) fn query<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_urlencoded::from_str(self.query.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))
    }
}

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;
pub(crate) type Handler = fn(Ctx) -> HandlerFuture;
pub(crate) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema function of `T`.
pub(crate) fn schema_of<T: JsonSchema>() -> SchemaFn {
    |g| g.subschema_for::<T>()
}

/// The API group a route belongs to (an OpenAPI tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum Group {
    Admin,
    Inference,
    /// Anthropic's Messages API, with its own error envelope.
    Anthropic,
    MultiModel,
    #[strum(serialize = "model-repository")]
    Repository,
    WeightControl,
    Operations,
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// Anyone.
    Open,
    /// The admin key's holder, when an admin key is configured.
    Admin,
    /// The holder of an inference key (or of the admin key), when inference keys are
    /// configured.
    Inference,
    /// Anyone, unless `http.metrics_require_key`: then as [`Auth::Inference`].
    Metrics,
}

/// What a route answers on success.
#[derive(Clone, Copy)]
pub(crate) enum Success {
    /// `application/json` of this type.
    Json(SchemaFn),
    /// `application/json` of the first type, or with `stream: true` a `text/event-stream`
    /// of events of the second.
    JsonOrEvents(SchemaFn, SchemaFn),
    /// Always a `text/event-stream` of events of this type.
    Events(SchemaFn),
    /// Prometheus / OpenMetrics text.
    Metrics,
    /// An HTML page.
    Html,
    /// A text file (a script, a style sheet).
    Text,
    /// No body.
    Empty,
}

/// One route: how it is matched, who may call it, what it takes and answers, and its
/// handler.
pub(crate) struct Route {
    pub(crate) method: Method,
    /// Path with `{param}` segments.
    pub(crate) path: &'static str,
    pub(crate) group: Group,
    pub(crate) auth: Auth,
    pub(crate) summary: &'static str,
    pub(crate) description: &'static str,
    /// Schema of the JSON request body, if it takes one, and whether it may be left out.
    pub(crate) body: Option<(SchemaFn, bool)>,
    /// Schema of the query parameters (an object schema), if it takes any.
    pub(crate) query: Option<SchemaFn>,
    /// The success answer.
    pub(crate) success: Success,
    /// A non-error answer besides 200 (readiness's 503), with its body.
    pub(crate) other: Option<(StatusCode, SchemaFn)>,
    /// The error codes the handler answers with (auth and body errors are added from
    /// `auth` and `body`).
    pub(crate) errors: &'static [ErrorCode],
    /// An example request body naming configured models, for the document.
    pub(crate) example: Option<fn(&ExampleModels) -> Option<serde_json::Value>>,
    pub(crate) handler: Handler,
}

/// Configured models the document's request examples name: the first enabled model of each
/// type (else the first of the type).
#[derive(Debug, Clone, Default)]
pub(crate) struct ExampleModels {
    pub(crate) llm: Option<String>,
    pub(crate) embedding: Option<String>,
    pub(crate) reranking: Option<String>,
    /// Whether each pick (llm, embedding, reranking) is an enabled model.
    enabled: [bool; 3],
}

impl ExampleModels {
    /// Takes the models of `page`, the next ones in config order, into account: of each
    /// type the first enabled model wins, else the first.
    pub(crate) fn add(&mut self, page: &[hangar_runtime::ModelSnapshot]) {
        for m in page {
            let (slot, enabled) = match m.model_type {
                hangar_config::ModelType::Llm => (&mut self.llm, &mut self.enabled[0]),
                hangar_config::ModelType::Embedding => (&mut self.embedding, &mut self.enabled[1]),
                hangar_config::ModelType::Reranking => (&mut self.reranking, &mut self.enabled[2]),
            };
            if slot.is_none() || (!*enabled && m.configured_enabled) {
                *slot = Some(m.name().to_owned());
                *enabled = m.configured_enabled;
            }
        }
    }
}

impl Route {
    /// A route with no body, no query, a JSON answer of `{}` and no errors: the builder's
    /// start. Inference routes take the inference keys; every other route is open until
    /// [`Route::admin`] or [`Route::inference`] says otherwise.
    pub(crate) fn new(method: Method, path: &'static str, group: Group, handler: Handler) -> Self {
        Self {
            method,
            path,
            group,
            auth: if matches!(group, Group::Inference | Group::Anthropic) {
                Auth::Inference
            } else {
                Auth::Open
            },
            summary: "",
            description: "",
            body: None,
            query: None,
            success: Success::Empty,
            other: None,
            errors: &[],
            example: None,
            handler,
        }
    }

    pub(crate) fn example(mut self, f: fn(&ExampleModels) -> Option<serde_json::Value>) -> Self {
        self.example = Some(f);
        self
    }

    pub(crate) fn admin(mut self) -> Self {
        self.auth = Auth::Admin;
        self
    }

    pub(crate) fn inference(mut self) -> Self {
        self.auth = Auth::Inference;
        self
    }

    pub(crate) fn metrics(mut self) -> Self {
        self.auth = Auth::Metrics;
        self
    }

    pub(crate) fn doc(mut self, summary: &'static str, description: &'static str) -> Self {
        self.summary = summary;
        self.description = description;
        self
    }

    /// A JSON body of `T`; `optional` when an empty body reads as `{}`.
    pub(crate) fn body<T: JsonSchema>(mut self, optional: bool) -> Self {
        self.body = Some((schema_of::<T>(), optional));
        self
    }

    pub(crate) fn query<T: JsonSchema>(mut self) -> Self {
        self.query = Some(schema_of::<T>());
        self
    }

    pub(crate) fn ok<T: JsonSchema>(mut self) -> Self {
        self.success = Success::Json(schema_of::<T>());
        self
    }

    pub(crate) fn events<E: JsonSchema>(mut self) -> Self {
        self.success = Success::Events(schema_of::<E>());
        self
    }

    pub(crate) fn ok_or_events<T: JsonSchema, E: JsonSchema>(mut self) -> Self {
        self.success = Success::JsonOrEvents(schema_of::<T>(), schema_of::<E>());
        self
    }

    pub(crate) fn success(mut self, success: Success) -> Self {
        self.success = success;
        self
    }

    pub(crate) fn also<T: JsonSchema>(mut self, status: StatusCode) -> Self {
        self.other = Some((status, schema_of::<T>()));
        self
    }

    pub(crate) fn errors(mut self, errors: &'static [ErrorCode]) -> Self {
        self.errors = errors;
        self
    }
}

/// The outcome of matching a request against the table.
pub(crate) enum Match<'a> {
    Found(&'a Route, Vec<String>),
    /// The path exists with other methods: the `Allow` header's value.
    MethodNotAllowed(String),
    NotFound,
}

/// The route table, indexed by path.
struct Table {
    routes: Vec<Route>,
    /// Each distinct path to the indexes of its routes.
    paths: matchit::Router<Vec<usize>>,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| {
    let routes = crate::routes::all();
    let mut by_path: Vec<(&'static str, Vec<usize>)> = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        match by_path.iter_mut().find(|(path, _)| *path == route.path) {
            Some((_, indexes)) => indexes.push(i),
            None => by_path.push((route.path, vec![i])),
        }
    }
    let mut paths = matchit::Router::new();
    for (path, indexes) in by_path {
        if let Err(e) = paths.insert(path, indexes) {
            panic!("route table: {path}: {e}");
        }
    }
    Table { routes, paths }
});

/// Every route of the service.
pub(crate) fn routes() -> &'static [Route] {
    &TABLE.routes
}

/// Finds the route for `method` and `path`; `HEAD` finds the `GET` route.
pub(crate) fn find<'a>(method: &Method, path: &str) -> Match<'a> {
    let method = if method == Method::HEAD { &Method::GET } else { method };
    let path = if path.len() > 1 { path.trim_end_matches('/') } else { path };
    let Ok(matched) = TABLE.paths.at(path) else { return Match::NotFound };
    let table: &'a Table = &TABLE;
    let mut params = Vec::new();
    for (_, raw) in matched.params.iter() {
        match percent_encoding::percent_decode_str(raw).decode_utf8() {
            Ok(decoded) => params.push(decoded.into_owned()),
            Err(_) => return Match::NotFound,
        }
    }
    let mut allowed = Vec::new();
    for &i in matched.value {
        let route = &table.routes[i];
        if route.method == *method {
            return Match::Found(route, params);
        }
        allowed.push(route.method.as_str());
        if route.method == Method::GET {
            allowed.push(Method::HEAD.as_str());
        }
    }
    Match::MethodNotAllowed(allowed.join(", "))
}

/// The auth class of the route `method path`; a path with no route is admin-only, so a
/// mistyped mirror path fails closed.
pub(crate) fn auth_of(method: &Method, path: &str) -> Auth {
    match find(method, path) {
        Match::Found(route, _) => route.auth,
        _ => Auth::Admin,
    }
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
        match find(&Method::GET, "/v1/admin/models/x/load") {
            Match::MethodNotAllowed(allow) => assert_eq!(allow, "POST"),
            _ => panic!("expected 405"),
        }
        match find(&Method::HEAD, "/v1/admin/models/x") {
            Match::Found(route, _) => assert_eq!(route.method, Method::GET),
            _ => panic!("HEAD finds the GET route"),
        }
        match find(&Method::DELETE, "/healthz") {
            Match::MethodNotAllowed(allow) => assert_eq!(allow, "GET, HEAD"),
            _ => panic!("expected 405"),
        }
        assert!(matches!(find(&Method::GET, "/nope"), Match::NotFound));
        assert!(matches!(find(&Method::GET, "/v1/admin/models//load"), Match::NotFound));
        assert!(matches!(find(&Method::GET, "/healthz/"), Match::Found(..)));
        assert!(matches!(find(&Method::GET, "/v1/admin/models/a%FFb"), Match::NotFound));
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
    fn escapes_decode_and_invalid_ones_stay_literal() {
        let decode =
            |s| percent_encoding::percent_decode_str(s).decode_utf8().map(|c| c.into_owned());
        assert_eq!(decode("a%2Fb").unwrap(), "a/b");
        assert_eq!(decode("a%zz").unwrap(), "a%zz");
    }
}
