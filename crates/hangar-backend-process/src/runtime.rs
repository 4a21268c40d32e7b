//! The runtimes: [`ChildRuntime`] (a supervised engine process) and [`RemoteRuntime`] (a
//! remote server), both serving by forwarding.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use hangar_backend::{
    Capabilities, EmbedRequest, Embeddings, ForwardRequest, ForwardResponse, GenerateEvent,
    GenerateRequest, GenerateSummary, RerankRequest, Rerankings, Runtime, RuntimeDetails,
    RuntimeError,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::supervisor::{Child, Spawner};
use crate::upstream::{Explain, Upstream};

/// How long a request whose connection broke waits for the engine's exit before it is told
/// "unavailable" instead of "crashed".
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// First and longest pause between readiness polls.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(250);

/// A loaded replica whose engine is a child process.
pub(crate) struct ChildRuntime {
    pub(crate) child: Arc<Child>,
    /// The child's client; taken (closing its idle keep-alive connections, which would
    /// hold up the child's exit) when the runtime unloads.
    pub(crate) upstream: Mutex<Option<Arc<Upstream>>>,
    pub(crate) capabilities: Capabilities,
    pub(crate) details: RuntimeDetails,
    /// Set by `unload`: the exit that follows is not a crash.
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) grace: Duration,
    /// The thread the child was forked from: its death signal fires when that thread ends,
    /// so the runtime keeps it alive as long as the child should live.
    pub(crate) _spawner: Arc<Spawner>,
}

/// A loaded remote model.
pub(crate) struct RemoteRuntime {
    pub(crate) upstream: Upstream,
    pub(crate) capabilities: Capabilities,
    pub(crate) details: RuntimeDetails,
}

/// Waits until the child answers 200 on its health route: polled at once after each line
/// that says it listens, else with a growing pause, until `limit`.
///
/// # Errors
/// Why it is not ready: it exited (with its last output) or `limit` passed.
pub(crate) async fn wait_ready(
    child: &Child,
    upstream: &Upstream,
    url: &str,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut pause = POLL_FIRST;
    loop {
        if let Some(status) = child.exited() {
            return Err(format!("it exited before it was ready: {}", child.obituary(&status)));
        }
        if upstream.probe(url, Duration::from_secs(2)).await == Ok(200) {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            let secs = limit.as_secs_f64();
            return Err(format!(
                "it was not ready after {secs} s (load_timeout_s): {}",
                child.obituary("was stopped")
            ));
        }
        tokio::select! {
            () = child.ready_hint.notified() => pause = POLL_FIRST,
            () = tokio::time::sleep(pause.min(deadline - now)) => pause = (pause * 2).min(POLL_MAX),
            _ = child.wait() => {}
        }
    }
}

/// Explains a broken connection to a child: a crash when the child has exited.
#[derive(Clone)]
struct ChildExplain(Arc<Child>);

impl Explain for ChildExplain {
    async fn explain(&self, error: String) -> RuntimeError {
        match self.0.wait_for(EXIT_GRACE).await {
            Some(status) => RuntimeError::Crashed { reason: self.0.obituary(&status) },
            None => {
                RuntimeError::Unavailable { message: format!("cannot reach the engine: {error}") }
            }
        }
    }
}

/// Explains a broken connection to a remote server.
#[derive(Clone)]
struct RemoteExplain(String);

impl Explain for RemoteExplain {
    async fn explain(&self, error: String) -> RuntimeError {
        RuntimeError::Unavailable {
            message: format!("the remote server {} is unreachable: {error}", self.0),
        }
    }
}

/// The answer of the typed entry points, which forwarding engines do not take: Hangar's
/// server passes their requests through ([`Runtime::forward`]).
fn typed_unsupported() -> RuntimeError {
    RuntimeError::Unsupported {
        message: "this engine serves the OpenAI API itself: its requests are passed through \
                  (Runtime::forward), not taken as typed requests"
            .into(),
    }
}

#[async_trait]
impl Runtime for ChildRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn details(&self) -> RuntimeDetails {
        let mut details = self.details.clone();
        details.insert("pid".into(), Value::from(self.child.pid()));
        details
    }

    async fn generate(
        &self,
        _request: GenerateRequest,
        _events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn embed(&self, _request: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn rerank(&self, _request: RerankRequest) -> Result<Rerankings, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        match self.child.exited() {
            Some(status) => Err(RuntimeError::Crashed { reason: self.child.obituary(&status) }),
            None => Ok(()),
        }
    }

    async fn unload(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        drop(self.upstream.lock().unwrap_or_else(PoisonError::into_inner).take());
        // Let the connection tasks see their client gone and close the sockets.
        tokio::task::yield_now().await;
        self.child.stop(self.grace).await;
    }

    fn forwards(&self) -> bool {
        true
    }

    async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, RuntimeError> {
        if let Some(status) = self.child.exited() {
            return Err(RuntimeError::Crashed { reason: self.child.obituary(&status) });
        }
        let upstream = self.upstream.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(upstream) = upstream else {
            return Err(RuntimeError::Unavailable { message: "the engine is stopping".into() });
        };
        upstream.forward(request, ChildExplain(Arc::clone(&self.child))).await
    }
}

#[async_trait]
impl Runtime for RemoteRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn details(&self) -> RuntimeDetails {
        self.details.clone()
    }

    async fn generate(
        &self,
        _request: GenerateRequest,
        _events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn embed(&self, _request: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn rerank(&self, _request: RerankRequest) -> Result<Rerankings, RuntimeError> {
        Err(typed_unsupported())
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn unload(&self) {}

    fn forwards(&self) -> bool {
        true
    }

    async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, RuntimeError> {
        self.upstream.forward(request, RemoteExplain(self.upstream.base.clone())).await
    }
}
