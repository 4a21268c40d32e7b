//! [`ForwardingRuntime`]: a loaded replica served by forwarding, to a supervised engine
//! process or to a remote server; and [`wait_ready`], a child's readiness.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use hangar_backend::{
    Capabilities, EmbedRequest, Embeddings, ForwardRequest, ForwardResponse, GenerateEvent,
    GenerateRequest, GenerateSummary, RerankRequest, Rerankings, Runtime, RuntimeDetails,
    RuntimeError, SleepLevel,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::owner::Owner;
use crate::sleep::SleepRoutes;
use crate::upstream::{Explain, Upstream};
use hangar_supervisor::{Child, Spawner};

/// How long a request whose connection broke waits for the engine's exit before it is told
/// "unavailable" instead of "crashed".
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// First and longest pause between readiness polls.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(250);

/// A loaded replica that passes requests through to an OpenAI-compatible server.
pub(crate) struct ForwardingRuntime {
    /// The server's client; taken when the runtime unloads (closing its idle keep-alive
    /// connections, which would hold up a child's exit).
    pub(crate) upstream: Mutex<Option<Arc<Upstream>>>,
    pub(crate) capabilities: Capabilities,
    pub(crate) details: RuntimeDetails,
    /// The child process serving it; `None` for a remote server.
    pub(crate) engine: Option<Engine>,
    /// vLLM's sleep routes, for a child with sleep mode on.
    pub(crate) sleep: Option<SleepRoutes>,
    /// Its saved prompt caches, saved before the child stops (`saved.rs`).
    pub(crate) saved: Option<crate::saved::SavedSlots>,
}

/// The supervised process behind a [`ForwardingRuntime`].
pub(crate) struct Engine {
    pub(crate) child: Arc<Child>,
    /// Set by `unload`: the exit that follows is not a crash.
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) grace: Duration,
    /// The thread the child was spawned from: its death signal fires when that thread ends,
    /// so the runtime keeps it alive as long as the child should live.
    pub(crate) _spawner: Arc<Spawner>,
    /// The private directory of its Unix socket, removed once the child has stopped.
    pub(crate) socket_dir: Mutex<Option<hangar_supervisor::PrivateDir>>,
}

/// Why a child did not become ready.
#[derive(Debug)]
pub(crate) enum NotReady {
    /// It exited, or `load_timeout_s` passed: the reason, with its last output.
    Failed(String),
    /// Another process listens on its port: what answered was not the engine.
    PortTaken(String),
}

/// Waits until the child answers 200 on its health route from a socket of its own (see
/// [`owner`](crate::owner); a child on a Unix socket, `port` `None`, listens in a directory
/// only Hangar's user can enter): polled at once after each line that says it listens, else
/// with a growing pause, until `limit`.
///
/// # Errors
/// Why it is not ready: it exited (with its last output), `limit` passed, or a process
/// outside the child's tree listens on `port`.
pub(crate) async fn wait_ready(
    child: &Child,
    upstream: &Upstream,
    (url, port): (&str, Option<u16>),
    limit: Duration,
) -> Result<(), NotReady> {
    let deadline = Instant::now() + limit;
    let mut pause = POLL_FIRST;
    loop {
        if let Some(status) = child.exited() {
            let why = format!("it exited before it was ready: {}", child.obituary(&status));
            return Err(NotReady::Failed(why));
        }
        if upstream.probe(url, Duration::from_secs(2)).await == Ok(200) {
            let Some(port) = port else { return Ok(()) };
            match crate::owner::owner(child.pid(), port) {
                Owner::Child => return Ok(()),
                Owner::Stranger(holders) => {
                    return Err(NotReady::PortTaken(squatter(port, child.pid(), &holders)));
                }
                Owner::Unknown => {
                    return Err(NotReady::Failed(format!(
                        "cannot read /proc/net/tcp to check that the socket on port {port} is \
                         the engine's; it is not trusted without that"
                    )));
                }
                // The socket that answered closed since: the child's exit or its bind says more.
                Owner::Nobody => {}
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let secs = limit.as_secs_f64();
            return Err(NotReady::Failed(format!(
                "it was not ready after {secs} s (load_timeout_s): {}",
                child.obituary("was stopped")
            )));
        }
        tokio::select! {
            () = child.says_it_listens() => pause = POLL_FIRST,
            () = tokio::time::sleep(pause.min(deadline - now)) => pause = (pause * 2).min(POLL_MAX),
            _ = child.wait() => {}
        }
    }
}

/// "port 8081 answers, but not from the engine (pid 41): it is held by pid 40 (`nc`)".
fn squatter(port: u16, pid: i32, holders: &[(i32, String)]) -> String {
    let held = if holders.is_empty() {
        "by a process Hangar cannot see (another user's)".to_owned()
    } else {
        let named: Vec<String> =
            holders.iter().map(|(p, comm)| format!("pid {p} (`{comm}`)")).collect();
        format!("by {}", named.join(", "))
    };
    format!(
        "port {port} answers, but not from the engine (pid {pid}): it is held {held}; \
         nothing was sent to it"
    )
}

/// Explains a broken connection: a crash when the child has exited (within
/// [`EXIT_GRACE`]), else the server is unavailable.
#[derive(Clone)]
enum Broken {
    Child(Arc<Child>),
    Remote(String),
}

impl Explain for Broken {
    async fn explain(&self, error: String) -> RuntimeError {
        match self {
            Self::Child(child) => match child.wait_for(EXIT_GRACE).await {
                Some(status) => RuntimeError::Crashed { reason: child.obituary(&status) },
                None => RuntimeError::Unavailable {
                    message: format!("cannot reach the engine: {error}"),
                },
            },
            Self::Remote(base) => RuntimeError::Unavailable {
                message: format!("the remote server {base} is unreachable: {error}"),
            },
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

impl ForwardingRuntime {
    /// The sleep routes and the client of a child that can sleep.
    fn sleep_routes(&self) -> Result<(&SleepRoutes, Arc<Upstream>), RuntimeError> {
        let Some(sleep) = &self.sleep else {
            let message = "this engine cannot sleep (vllm_enable_sleep_mode is off)".into();
            return Err(RuntimeError::Unsupported { message });
        };
        let upstream = self.upstream.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let upstream = upstream.ok_or_else(|| RuntimeError::Unavailable {
            message: "the engine is stopping".into(),
        })?;
        Ok((sleep, upstream))
    }

    /// The engine's crash, when its process has exited.
    fn crashed(&self) -> Option<RuntimeError> {
        let child = &self.engine.as_ref()?.child;
        let status = child.exited()?;
        Some(RuntimeError::Crashed { reason: child.obituary(&status) })
    }
}

#[async_trait]
impl Runtime for ForwardingRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// What the load recorded, and `dispatch_ahead` from the capabilities.
    fn pid(&self) -> Option<u32> {
        let pid = self.engine.as_ref()?.child.pid();
        u32::try_from(pid).ok()
    }

    fn details(&self) -> RuntimeDetails {
        let mut details = self.details.clone();
        details.insert("dispatch_ahead".into(), self.capabilities.dispatch_ahead.into());
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
        self.crashed().map_or(Ok(()), Err)
    }

    async fn sleep(&self, level: SleepLevel) -> Result<(), RuntimeError> {
        let (sleep, upstream) = self.sleep_routes()?;
        sleep.sleep(&upstream, level).await.map_err(|e| self.crashed().unwrap_or(e))
    }

    async fn wake(&self) -> Result<(), RuntimeError> {
        let (sleep, upstream) = self.sleep_routes()?;
        sleep.wake(&upstream).await.map_err(|e| self.crashed().unwrap_or(e))
    }

    async fn unload(&self) {
        let upstream = self.upstream.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let (Some(saved), Some(upstream), None) = (&self.saved, upstream, self.crashed()) {
            saved.save(&upstream).await;
        }
        drop(self.upstream.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(engine) = &self.engine {
            engine.stopping.store(true, Ordering::SeqCst);
            // Let the connection tasks see their client gone and close the sockets.
            tokio::task::yield_now().await;
            engine.child.stop(engine.grace).await;
            drop(engine.socket_dir.lock().unwrap_or_else(PoisonError::into_inner).take());
        }
    }

    fn forwards(&self) -> bool {
        true
    }

    async fn forward(&self, request: ForwardRequest) -> Result<ForwardResponse, RuntimeError> {
        if let Some(crash) = self.crashed() {
            return Err(crash);
        }
        let upstream = self.upstream.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(upstream) = upstream else {
            return Err(RuntimeError::Unavailable { message: "the engine is stopping".into() });
        };
        let broken = match &self.engine {
            Some(engine) => Broken::Child(Arc::clone(&engine.child)),
            None => Broken::Remote(upstream.base.clone()),
        };
        upstream.forward(request, broken).await
    }
}
