//! Request bodies and event ids through the real service, in process: one `HangarService`
//! over stub models, made once per thread and kept across inputs (state changes that an
//! input causes, such as an unload, stay for the next, as on a live server).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_runtime::{Backends, LoadOptions, Manager};
use hangar_server::{ErrorBody, HangarService, ServerOptions, V2ErrorBody};
use hangar_stub::StubBackend;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

/// The longest one request may take: a request that waits longer is a hang.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// Configured model names, also the `{name}` of the routes.
const MODELS: [&str; 4] = ["chat", "embed", "rerank", "cold"];

/// One thread's service, its runtime, and the POST routes that take a JSON body.
pub(crate) struct Harness {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) service: HangarService,
    routes: Vec<String>,
}

thread_local! {
    pub(crate) static HARNESS: Harness = Harness::new();
}

impl Harness {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let runtime = runtime.expect("a runtime");
        let config = hangar_config::Config::from_value(&json!({
            "auto_load": true,
            "max_loaded_models": { "llm": 2, "embedding": 1, "reranking": 1 },
            "models": {
                "chat": { "backend": "stub", "replica_max": 2, "stub": { "reply": "fixed words" } },
                "embed": { "backend": "stub", "type": "embedding" },
                "rerank": { "backend": "stub", "type": "reranking" },
                "cold": { "backend": "stub", "stub": { "thinking": true, "reply": "cold" } },
            }
        }))
        .expect("a valid config");
        let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
        runtime.block_on(async {
            for name in ["chat", "embed", "rerank"] {
                manager.load(name, LoadOptions::default()).await.expect("a stub loads");
            }
        });
        let service = HangarService::new(manager, ServerOptions::default());
        let routes = runtime.block_on(body_routes(&service));
        Self { runtime, service, routes }
    }

    /// The answer to `request`, whole: status, and the body when it ends (an event stream
    /// is not read: its head is the answer).
    fn call(&self, request: Request<Full<Bytes>>) -> (u16, Option<Bytes>) {
        let what = format!("{} {}", request.method(), request.uri());
        self.runtime.block_on(async {
            let answer = tokio::time::timeout(PATIENCE, async {
                let response: Response<_> = self.service.handle(request).await;
                let status = response.status().as_u16();
                let streamed = response
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
                if streamed {
                    return (status, None);
                }
                let body = response.into_body().collect().await.expect("a body").to_bytes();
                (status, Some(body))
            });
            answer.await.unwrap_or_else(|_| panic!("{what} took longer than {PATIENCE:?}"))
        })
    }
}

/// Every POST route of the OpenAPI document with a JSON body, `{name}` naming a model
/// (`chat`, except where the route's position picks another). Routes that pause a model
/// are left out: a paused model holds every later request, as it should.
async fn body_routes(service: &HangarService) -> Vec<String> {
    let request = Request::get("/openapi.json").body(Full::new(Bytes::new())).expect("a request");
    let body = service.handle(request).await.into_body().collect().await.expect("a body");
    let doc: Value = serde_json::from_slice(&body.to_bytes()).expect("the document");
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let takes_json = item.pointer("/post/requestBody/content/application~1json").is_some();
        if !takes_json || path.contains("pause") {
            continue;
        }
        for model in MODELS {
            routes.push(path.replace("{name}", model));
            if !path.contains("{name}") {
                break;
            }
        }
    }
    assert!(routes.len() >= 10, "the body routes of the document: {routes:?}");
    routes
}

/// Whether `answer` is the route's error envelope with a known code.
fn typed_error(path: &str, answer: &Bytes) -> bool {
    if path.starts_with("/v2/") {
        serde_json::from_slice::<V2ErrorBody>(answer).is_ok()
    } else {
        serde_json::from_slice::<ErrorBody>(answer).is_ok()
    }
}

/// A request body for one POST route: the first byte picks the route, the rest is the body.
///
/// Invariants: the service answers within [`PATIENCE`], below 500, and a refusal is the
/// route group's error envelope with a known code.
pub(crate) fn bodies(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else { return };
    HARNESS.with(|h| {
        let path = &h.routes[usize::from(pick) % h.routes.len()];
        let request = Request::builder()
            .method(Method::POST)
            .uri(path.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::copy_from_slice(body)))
            .expect("a request");
        let (status, answer) = h.call(request);
        let shown = || String::from_utf8_lossy(answer.as_deref().unwrap_or_default()).into_owned();
        assert!(status < 500, "POST {path} -> {status}: {}", shown());
        if let Some(answer) = &answer
            && !(200..300).contains(&status)
        {
            assert!(typed_error(path, answer), "POST {path} -> {status}, untyped: {}", shown());
        }
    });
}

/// A `Last-Event-ID` (as the header; as the query parameter when the bytes cannot be a
/// header value) for `GET /v1/admin/events`.
///
/// Invariants: an id of this server's form (`<epoch>-<n>`, digits) is answered 200 with an
/// event stream; anything else 400 with the error envelope.
pub(crate) fn event_id(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut request = Request::builder().method(Method::GET);
    let header = http::HeaderValue::from_bytes(data).ok();
    request = match header {
        Some(value) => request.uri("/v1/admin/events").header("last-event-id", value),
        None => {
            let query: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
            request.uri(format!("/v1/admin/events?last_event_id={query}"))
        }
    };
    let request = request.body(Full::new(Bytes::new())).expect("a request");
    HARNESS.with(|h| {
        let (status, answer) = h.call(request);
        let well_formed = text.trim().split_once('-').is_some_and(|(epoch, n)| {
            [epoch, n].iter().all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                && epoch.parse::<u64>().is_ok()
                && n.parse::<u64>().is_ok()
        });
        let well_formed = well_formed && std::str::from_utf8(data).is_ok();
        if well_formed {
            assert_eq!(status, 200, "{text:?} is an event id");
        } else {
            assert_eq!(status, 400, "{text:?} is no event id");
            let answer = answer.expect("an error answer has a body");
            assert!(typed_error("/v1/admin/events", &answer), "untyped: {answer:?}");
        }
    });
}
