//! What the tests of `hangar-server` share: a service over stub engines built from a config
//! ([`server`]), requests sent to it in process ([`request`], [`call`], [`get`], [`post`]),
//! and answers read whole ([`Answer`]) or event by event ([`Sse`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::Backend;
use hangar_config::{BackendKind, Config, Secret};
use hangar_runtime::{Backends, GpuProbe, LoadOptions, Manager};
use hangar_server::{HangarService, Response, ResponseBody, ServerOptions};
use hangar_stub::StubBackend;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------
// The service

/// A service to build, in the style of a test-support builder:
/// `server().models(json!({ "chat": { "backend": "stub" } })).admin_key("k").build()`.
pub(crate) fn server() -> Builder {
    Builder::default()
}

/// A change to the options the config gives.
type OptionsEdit = Box<dyn FnOnce(&mut ServerOptions)>;

/// The config, engines and options of a service; [`Builder::build`] or [`Builder::start`]
/// makes it.
#[derive(Default)]
pub(crate) struct Builder {
    settings: Map<String, Value>,
    kinds: Vec<BackendKind>,
    backends: Vec<Arc<dyn Backend>>,
    stub: Option<Arc<StubBackend>>,
    probe: Option<Arc<dyn GpuProbe>>,
    edits: Vec<OptionsEdit>,
    loaded: Vec<String>,
}

impl Builder {
    /// The config's `models` section.
    pub(crate) fn models(self, models: Value) -> Self {
        self.settings(json!({ "models": models }))
    }

    /// Top-level config settings (`max_loaded_models`, `http`, `limits`...), each over the
    /// same key set before.
    pub(crate) fn settings(mut self, settings: Value) -> Self {
        let Value::Object(settings) = settings else { panic!("settings are an object") };
        self.settings.extend(settings);
        self
    }

    /// Stub engines for these backend kinds too, besides `stub`.
    pub(crate) fn stub_kinds(mut self, kinds: impl IntoIterator<Item = BackendKind>) -> Self {
        self.kinds.extend(kinds);
        self
    }

    /// The stub engine of `stub` models, for a test that reads what it saw.
    pub(crate) fn stub(mut self, stub: Arc<StubBackend>) -> Self {
        self.stub = Some(stub);
        self
    }

    /// Another engine.
    pub(crate) fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// The GPU probe the manager reads.
    pub(crate) fn gpu_probe(mut self, probe: Arc<dyn GpuProbe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// The admin key (`None`: admin routes stay open).
    pub(crate) fn admin_key<'a>(self, key: impl Into<Option<&'a str>>) -> Self {
        let key = key.into().map(Secret::new);
        self.options(move |o| o.admin_api_key = key)
    }

    /// The inference keys.
    pub(crate) fn inference_keys(self, keys: &[&str]) -> Self {
        let keys: Vec<Secret> = keys.iter().map(|k| Secret::new(*k)).collect();
        self.options(move |o| o.inference_api_keys = keys)
    }

    /// Changes the options the config gives (`ServerOptions::from_config`).
    pub(crate) fn options(mut self, edit: impl FnOnce(&mut ServerOptions) + 'static) -> Self {
        self.edits.push(Box::new(edit));
        self
    }

    /// Models [`Builder::start`] loads before it hands out the service; each must load.
    pub(crate) fn loaded<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        self.loaded.extend(names.into_iter().map(str::to_owned));
        self
    }

    /// The service, nothing loaded.
    pub(crate) fn build(self) -> HangarService {
        assert!(self.loaded.is_empty(), "models to load: use `start`");
        let config = Value::Object(self.settings);
        let config = Config::from_value(&config).unwrap_or_else(|e| panic!("test config: {e}"));
        let stub = self.stub.unwrap_or_else(|| Arc::new(StubBackend::new()));
        let mut backends = Backends::new().with(stub);
        for kind in self.kinds {
            backends = backends.with(Arc::new(StubBackend::with_kind(kind)));
        }
        for backend in self.backends {
            backends = backends.with(backend);
        }
        let manager = Manager::new(&config, backends);
        if let Some(probe) = self.probe {
            manager.set_gpu_probe(probe);
        }
        let mut options = ServerOptions::from_config(&config);
        for edit in self.edits {
            edit(&mut options);
        }
        HangarService::new(manager, options)
    }

    /// The service, with the models of [`Builder::loaded`] loaded.
    pub(crate) async fn start(mut self) -> HangarService {
        let loaded = std::mem::take(&mut self.loaded);
        let service = self.build();
        for name in loaded {
            let loading = service.manager().load(&name, LoadOptions::default()).await;
            loading.unwrap_or_else(|e| panic!("{name} does not load: {e}"));
        }
        service
    }
}

// ---------------------------------------------------------------------------------------
// Requests

/// What a request carries: text as it is, JSON as its text, `Value::Null` as no body.
pub(crate) trait IntoBody {
    fn into_bytes(self) -> Bytes;
}

impl IntoBody for &str {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self.to_owned())
    }
}

impl IntoBody for String {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBody for &&str {
    fn into_bytes(self) -> Bytes {
        (*self).into_bytes()
    }
}

impl IntoBody for &String {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self.clone())
    }
}

impl IntoBody for &Value {
    fn into_bytes(self) -> Bytes {
        if self.is_null() { Bytes::new() } else { Bytes::from(self.to_string()) }
    }
}

impl IntoBody for Value {
    fn into_bytes(self) -> Bytes {
        (&self).into_bytes()
    }
}

/// A request to build: `request(Method::POST, path).bearer(key).body(json).send(&s)`.
pub(crate) fn request<M>(method: M, path: &str) -> Call
where
    Method: TryFrom<M>,
    <Method as TryFrom<M>>::Error: Into<http::Error>,
{
    Call { request: Request::builder().method(method).uri(path), body: Bytes::new() }
}

/// A request being built.
pub(crate) struct Call {
    request: http::request::Builder,
    body: Bytes,
}

impl Call {
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.request = self.request.header(name, value);
        self
    }

    pub(crate) fn headers(self, headers: &[(&str, &str)]) -> Self {
        headers.iter().fold(self, |call, (name, value)| call.header(name, value))
    }

    /// As the listener marks a request that came from `peer` (an `ip:port`).
    pub(crate) fn from(mut self, peer: &str) -> Self {
        let peer = peer.parse().expect("a socket address");
        self.request = self.request.extension(hangar_server::PeerAddr(peer));
        self
    }

    /// `Authorization: Bearer <key>`.
    pub(crate) fn bearer(self, key: &str) -> Self {
        self.header("authorization", &format!("Bearer {key}"))
    }

    pub(crate) fn body(mut self, body: impl IntoBody) -> Self {
        self.body = body.into_bytes();
        self
    }

    /// The service's response, its body unread.
    pub(crate) async fn respond(self, s: &HangarService) -> Response {
        s.handle(self.request.body(Full::new(self.body)).expect("a valid request")).await
    }

    /// The answer, read whole.
    pub(crate) async fn send(self, s: &HangarService) -> Answer {
        let (parts, body) = self.respond(s).await.into_parts();
        let raw = body.collect().await.expect("the body reads").to_bytes();
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Answer { status: parts.status.as_u16(), headers: parts.headers, body, raw }
    }
}

/// An answer read whole.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    /// The body as JSON; `Value::Null` when it is empty or not JSON.
    pub(crate) body: Value,
    pub(crate) raw: Bytes,
}

impl Answer {
    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

/// `method path` with `body`: the status and the JSON body (`Value::Null` if none).
pub(crate) async fn call(
    s: &HangarService,
    method: Method,
    path: &str,
    body: impl IntoBody,
) -> (u16, Value) {
    let answer = request(method, path).body(body).send(s).await;
    (answer.status, answer.body)
}

/// `GET path`.
pub(crate) async fn get(s: &HangarService, path: &str) -> (u16, Value) {
    call(s, Method::GET, path, "").await
}

/// `POST path` with `body`.
pub(crate) async fn post(s: &HangarService, path: &str, body: impl IntoBody) -> (u16, Value) {
    call(s, Method::POST, path, body).await
}

/// The model's admin row (must answer 200).
pub(crate) async fn row(s: &HangarService, model: &str) -> Value {
    let (status, row) = get(s, &format!("/v1/admin/models/{model}")).await;
    assert_eq!(status, 200, "{row}");
    row
}

/// Loads `model` through the admin API; it must load.
pub(crate) async fn load(s: &HangarService, model: &str) {
    let (status, row) = post(s, &format!("/v1/admin/models/{model}/load"), json!({})).await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
}

/// The model's runtime state, from the manager.
pub(crate) fn state(s: &HangarService, model: &str) -> String {
    s.manager().model(model).expect("a configured model").runtime_state.to_string()
}

/// `/metrics` as text.
pub(crate) async fn metrics(s: &HangarService) -> String {
    request(Method::GET, "/metrics").send(s).await.text()
}

/// A chat request for `model` with one user message and the fields of `extra`.
pub(crate) fn chat_body(model: &str, content: &str, extra: Value) -> Value {
    let mut body = json!({ "model": model, "messages": [{ "role": "user", "content": content }] });
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    body
}

// ---------------------------------------------------------------------------------------
// Server-sent events

/// One server-sent event.
#[derive(Debug)]
pub(crate) struct Event {
    /// `event:`, when there is one (the Responses API names its events).
    pub(crate) name: Option<String>,
    /// `id:`, when there is one (the admin event feed numbers its events).
    pub(crate) id: Option<String>,
    /// The `data:` lines, joined.
    pub(crate) data: String,
}

impl Event {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }
}

/// An event stream read event by event; a line that is no SSE field fails the test.
pub(crate) struct Sse {
    body: ResponseBody,
    buf: String,
}

impl Sse {
    /// Reads `response`, which must be a 200 event stream.
    pub(crate) fn of(response: Response) -> Self {
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[http::header::CONTENT_TYPE], "text/event-stream");
        Self { body: response.into_body(), buf: String::new() }
    }

    /// The next event with data (comments are skipped); `None` at the end of the body. Each
    /// read waits at most 10 s.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.take() {
                return Some(event);
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("a frame within 10 s")?
                .expect("the body reads");
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).expect("events are UTF-8"));
            }
        }
    }

    /// Every remaining event, read to the end of the body however long it takes (on
    /// paused time too).
    pub(crate) async fn all(mut self) -> Vec<Event> {
        let rest = (&mut self.body).collect().await.expect("the body reads").to_bytes();
        self.buf.push_str(std::str::from_utf8(&rest).expect("events are UTF-8"));
        let mut events = Vec::new();
        while let Some(event) = self.take() {
            events.push(event);
        }
        assert!(self.buf.trim().is_empty(), "a partial event at the end: {:?}", self.buf);
        events
    }

    /// The first whole event with data in the buffer.
    fn take(&mut self) -> Option<Event> {
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut event = Event { name: None, id: None, data: String::new() };
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_owned());
                } else if let Some(id) = line.strip_prefix("id: ") {
                    event.id = Some(id.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data.push_str(data);
                } else {
                    let other =
                        line.is_empty() || line.starts_with(':') || line.starts_with("retry: ");
                    assert!(other, "not a server-sent event field: {line:?}");
                }
            }
            if !event.data.is_empty() {
                return Some(event);
            }
        }
        None
    }
}

/// POSTs `body` to `path` and reads the whole event stream it answers.
pub(crate) async fn stream(s: &HangarService, path: &str, body: Value) -> Vec<Event> {
    Sse::of(request(Method::POST, path).body(body).respond(s).await).all().await
}
