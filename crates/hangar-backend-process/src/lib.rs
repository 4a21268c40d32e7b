//! Hangar's subprocess and remote engines.
//!
//! This crate owns the engines that serve the OpenAI API themselves, and the one supervisor
//! of every child process Hangar starts:
//!
//! - [`ProcessBackend`]: `llama_server` (llama.cpp's `llama-server`) and `vllm_serve`
//!   (`vllm serve`) children — argv and environment from the effective model definition
//!   ([`launch`]), a free loopback port per replica, their own process group, SIGKILL when
//!   Hangar dies, output line by line into the model's log and `tracing`, readiness from
//!   their output and health route under `load_timeout_s`, crash detection while loaded
//!   (reported through the load's crash sink, with the exit status and last output), stop by
//!   SIGTERM to the group and SIGKILL after a grace period;
//! - [`RemoteBackend`]: `openai_remote`, a configured OpenAI-compatible base URL with its API
//!   key (from config or the environment variable it names), checked at load;
//! - one forwarding client per runtime (pooled keep-alive connections, each driven by the
//!   task that forwards a request): request bodies pass through as
//!   sent, answers come back chunk by chunk, a client that goes away cancels the upstream
//!   request, engine errors keep their message;
//! - every child under the one supervisor of `hangar-supervisor` ([`Spawner`], [`Child`]);
//! - [`DISPATCH_AHEAD`]: these engines queue requests themselves, so the scheduler hands
//!   each replica two requests beyond its in-flight target;
//! - `vllm_serve` children on a Unix socket in a private directory unless their host or port
//!   is configured (vLLM's key guards only `/v1`), and vLLM's sleep mode
//!   (`vllm_enable_sleep_mode`): its sleep and wake-up routes, which take no key.

pub mod launch;
mod owner;
mod pool;
mod runtime;
mod saved;
mod sleep;
mod upstream;

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hangar_backend::{
    Backend, Capabilities, LoadError, LoadRequest, LogStream, Modality, ModelLogs, Runtime,
    ThinkingMode,
};
use hangar_config::{BackendKind, BackendSettings, ModelConfig};
use serde_json::Value;

use crate::launch::Launch;
use crate::runtime::{Engine, ForwardingRuntime, NotReady, wait_ready};
use crate::sleep::{SleepRoutes, socket_dir};
use crate::upstream::Upstream;
pub use hangar_supervisor::{Child, STOP_GRACE, Spawner};

/// Requests Hangar hands one replica beyond its `target_inflight`: these engines queue
/// requests themselves, so a request waiting there starts the moment a slot frees instead
/// of after a round trip through Hangar (with `llama-server` on one thread, that round trip
/// cost 30-34% of throughput). Measured in `docs/benchmarks.md`: one ahead still left 16%
/// of it on 2 busy cores, two recovered all of it. The rest wait in Hangar's queue, where
/// pauses, unloads and the admin API see them. Shown as `dispatch_ahead` in the runtime
/// details.
pub const DISPATCH_AHEAD: u32 = 2;

/// The engine of `llama_server` or `vllm_serve` models: one supervised child per replica.
pub struct ProcessBackend {
    kind: BackendKind,
    spawner: Arc<Spawner>,
    grace: Duration,
}

impl ProcessBackend {
    /// The `llama_server` engine.
    pub fn llama_server() -> Self {
        Self { kind: BackendKind::LlamaServer, spawner: Spawner::new(), grace: STOP_GRACE }
    }

    /// The `vllm_serve` engine.
    pub fn vllm_serve() -> Self {
        Self { kind: BackendKind::VllmServe, spawner: Spawner::new(), grace: STOP_GRACE }
    }

    /// The same engine whose children get the variables of Hangar's environment that
    /// `inherit` passes (`children`), never `HANGAR_*`.
    pub fn with_child_env(mut self, inherit: hangar_config::ChildEnv) -> Self {
        self.spawner = Spawner::with_env(inherit);
        self
    }

    /// The same engine with another SIGTERM → SIGKILL grace period.
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The launch of `model`'s replica (on `socket` when it has one), and whether Hangar
    /// picked its port (none configured).
    fn launch(
        &self,
        model: &ModelConfig,
        replica: u32,
        gpus: &[u32],
        socket: Option<&Path>,
    ) -> Result<(Launch, bool), LoadError> {
        let port = free_port()?;
        let mut launch = match self.kind {
            BackendKind::VllmServe => launch::vllm_serve(model, replica, port, socket)?,
            _ => launch::llama_server(model, replica, port)?,
        };
        let placed = hangar_backend::cuda_environment(gpus, &launch.env);
        launch.env.extend(placed);
        let picked = launch.port == port && launch.socket.is_none();
        Ok((launch, picked))
    }

    /// The saved prompt caches of a `llama-server` generation model's replica started by
    /// `launch`, when the load has a root for them. Opened on a blocking thread: the
    /// store's identity reads the whole model file the first time.
    async fn saved_slots(
        &self,
        model: &ModelConfig,
        root: Option<&hangar_backend::PromptCacheRoot>,
        launch: &Launch,
    ) -> Option<saved::SavedSlots> {
        let usable = self.kind == BackendKind::LlamaServer
            && model.model_type == hangar_config::ModelType::Llm;
        let (root, file) = (root.filter(|_| usable)?.clone(), model.model_path.clone()?);
        let (name, slots, launch) =
            (model.name.to_string(), model.target_inflight.get(), launch.clone());
        let open = move || saved::SavedSlots::open(&root, &name, Path::new(&file), &launch, slots);
        tokio::task::spawn_blocking(open).await.ok().flatten()
    }

    /// Whether `model`'s children listen on a private socket (`launch::on_socket`).
    fn on_socket(&self, model: &ModelConfig) -> bool {
        matches!(&model.settings, BackendSettings::VllmServe { serve, .. } if launch::on_socket(serve))
    }

    /// Whether `model`'s children can sleep: `vllm_serve` with vLLM's sleep mode.
    fn sleeps(&self, model: &ModelConfig) -> bool {
        matches!(&model.settings, BackendSettings::VllmServe { engine, .. } if engine.sleeps())
    }

    /// Starts the child and waits until it serves. A child that could not bind the port
    /// Hangar picked for it (taken by another process between the pick and the bind) is
    /// started again on another port, up to [`PORT_ATTEMPTS`] times in all.
    async fn start(
        &self,
        model: &ModelConfig,
        replica: u32,
        gpus: &[u32],
        logs: &ModelLogs,
        prompt_cache: Option<&hangar_backend::PromptCacheRoot>,
    ) -> Result<Started, LoadError> {
        let name = model.name.as_str();
        // A `vllm serve` child listens on a socket in a directory of its own (0700), removed
        // with the runtime, unless its host or port is configured.
        let (dir, socket) = match self.on_socket(model) {
            true => socket_dir().map(|(dir, socket)| (Some(dir), Some(socket)))?,
            false => (None, None),
        };
        let mut saved = None;
        for attempt in 1..=PORT_ATTEMPTS {
            let (mut launch, picked) = self.launch(model, replica, gpus, socket.as_deref())?;
            if saved.is_none() {
                saved = self.saved_slots(model, prompt_cache, &launch).await;
            }
            if let Some(saved) = &saved {
                saved.point(&mut launch);
            }
            // The child serves the model's name alone: a request naming an alias is renamed.
            let rename = launch::served_name(model);
            let mut upstream = Upstream::new(launch.base_url(), launch.api_key.as_deref(), rename)
                .map_err(|message| LoadError::Refused { message })?;
            if let Some(socket) = &launch.socket {
                upstream = upstream.on_socket(socket.clone());
            }
            let child = self.spawner.spawn(&launch, name, replica, logs).await.map_err(|e| {
                LoadError::Refused { message: format!("cannot start `{}`: {e}", launch.program) }
            })?;
            let child = Arc::new(child);
            let limit = model.load_timeout();
            let health = launch.health_url();
            let port = launch.socket.is_none().then_some(launch.port);
            let why = match wait_ready(&child, &upstream, (&health, port), limit).await {
                Ok(()) => return Ok(Started { launch, upstream, child, dir, saved }),
                Err(why) => why,
            };
            child.stop(self.grace).await;
            let lost = match &why {
                NotReady::Failed(why) => lost_port(why),
                NotReady::PortTaken(_) => true,
            };
            if picked && attempt < PORT_ATTEMPTS && lost {
                let line = format!(
                    "port {} was taken before the engine could bind it; starting it again on another port",
                    launch.port
                );
                logs.push(replica, LogStream::Hangar, line);
                continue;
            }
            let program = &launch.program;
            return Err(match why {
                NotReady::Failed(why) => {
                    LoadError::Failed { message: format!("`{program}`: {why}") }
                }
                NotReady::PortTaken(message) => LoadError::PortTaken { port: launch.port, message },
            });
        }
        unreachable!("the last attempt returns")
    }
}

/// A child that serves: how it was started, its client, its process, and the directory of
/// its socket when it listens on one.
struct Started {
    launch: Launch,
    upstream: Upstream,
    child: Arc<Child>,
    dir: Option<hangar_supervisor::PrivateDir>,
    /// Its saved prompt caches (`llama-server` generation models with a root).
    saved: Option<saved::SavedSlots>,
}

/// Starts of one replica when the port Hangar picked is taken before the child binds it.
const PORT_ATTEMPTS: u32 = 3;

/// Whether a child's failure to start says it could not bind its port (llama-server,
/// uvicorn and Python's own wording).
fn lost_port(why: &str) -> bool {
    let why = why.to_ascii_lowercase();
    ["couldn't bind", "cannot bind", "address already in use", "errno 98"]
        .iter()
        .any(|needle| why.contains(needle))
}

#[async_trait]
impl Backend for ProcessBackend {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        let mut caps = Capabilities { dispatch_ahead: DISPATCH_AHEAD, ..Capabilities::default() };
        match &model.settings {
            BackendSettings::LlamaServer(s) if s.llama_server_mmproj.is_some() => {
                caps.modalities.push(Modality::Image);
            }
            BackendSettings::VllmServe { .. } => {
                let target = launch::vllm_target(model).unwrap_or_default().to_ascii_lowercase();
                if ["qwen3", "gemma-4", "gemma4"].iter().any(|family| target.contains(family)) {
                    caps.thinking_modes = all_thinking_modes();
                }
                if self.sleeps(model) {
                    caps.sleep_levels = sleep::LEVELS.to_vec();
                }
            }
            _ => {}
        }
        caps
    }

    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        let LoadRequest { model, replica, progress, crash, logs, gpus, prompt_cache, .. } = request;
        let Started { launch, upstream, child, dir, saved } =
            self.start(&model, replica, &gpus, &logs, prompt_cache.as_ref()).await?;
        if let Some(saved) = &saved {
            saved.restore(&upstream).await;
        }
        progress.report(1.0);
        let stopping = Arc::new(AtomicBool::new(false));
        {
            let (child, stopping) = (Arc::clone(&child), Arc::clone(&stopping));
            tokio::spawn(async move {
                let status = child.wait().await;
                if !stopping.load(Ordering::SeqCst) {
                    crash.report(child.obituary(&status));
                }
            });
        }
        let mut details = hangar_backend::RuntimeDetails::new();
        details.insert("backend_url".into(), Value::from(launch.base_url()));
        details.insert("command".into(), Value::from(launch.command_line()));
        details.insert("pid".into(), Value::from(child.pid()));
        if let Some(socket) = &launch.socket {
            details.insert("socket".into(), Value::from(socket.display().to_string()));
        }
        let sleeps = self.sleeps(&model) && dir.is_some();
        let sleep = sleeps.then(|| SleepRoutes::new(model.load_timeout()));
        let engine = Engine {
            child,
            stopping,
            grace: self.grace,
            _spawner: Arc::clone(&self.spawner),
            socket_dir: Mutex::new(dir),
        };
        Ok(Arc::new(ForwardingRuntime {
            upstream: Mutex::new(Some(Arc::new(upstream))),
            capabilities: self.capabilities(&model),
            details,
            engine: Some(engine),
            sleep,
            saved,
        }))
    }

    fn forwards(&self) -> bool {
        true
    }
}

/// The engine of `openai_remote` models: a remote OpenAI-compatible server.
#[derive(Debug, Default)]
pub struct RemoteBackend;

#[async_trait]
impl Backend for RemoteBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::OpenaiRemote
    }

    fn capabilities(&self, _model: &ModelConfig) -> Capabilities {
        Capabilities {
            thinking_modes: all_thinking_modes(),
            dispatch_ahead: DISPATCH_AHEAD,
            ..Capabilities::default()
        }
    }

    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        let model = &request.model;
        let BackendSettings::OpenaiRemote(s) = &model.settings else {
            return Err(LoadError::Refused {
                message: format!("model '{}' is not openai_remote", model.name),
            });
        };
        let base = s.openai_base_url.clone().unwrap_or_default();
        let base = base.trim_end_matches('/').to_owned();
        let api_key = match (&s.openai_api_key, &s.openai_api_key_env) {
            (Some(key), _) => Some(key.expose().to_owned()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| LoadError::Refused {
                message: format!(
                    "openai_api_key_env names `{var}`, which is not set in Hangar's environment"
                ),
            })?),
            (None, None) => None,
        };
        // The remote server knows the model by `openai_model`, else by its name here: a
        // request naming an alias is renamed to that.
        let remote = s.openai_model.clone().unwrap_or_else(|| model.name.to_string());
        let rename = (remote != model.name.as_str() || !model.aliases.is_empty()).then_some(remote);
        // A remote server's answer is not cured by evicting local models.
        let failed = |message: String| LoadError::Refused { message };
        let upstream = Upstream::new(base.clone(), api_key.as_deref(), rename)
            .map_err(|why| failed(format!("openai_base_url: {why}")))?;
        let url = format!("{base}/models");
        let limit = model.load_timeout().min(Duration::from_secs(30));
        match upstream.probe(&url, limit).await {
            Ok(status) if (200..300).contains(&status) => {}
            Ok(401 | 403) => {
                return Err(failed(format!(
                    "the remote server {base} refused the API key (GET {url})"
                )));
            }
            Ok(status) => {
                return Err(failed(format!(
                    "the remote server {base} answered {status} to GET {url}"
                )));
            }
            Err(e) => return Err(failed(format!("the remote server {base} is unreachable: {e}"))),
        }
        request.progress.report(1.0);
        let mut details = hangar_backend::RuntimeDetails::new();
        details.insert("backend_url".into(), Value::from(base));
        Ok(Arc::new(ForwardingRuntime {
            upstream: Mutex::new(Some(Arc::new(upstream))),
            capabilities: self.capabilities(model),
            details,
            engine: None,
            sleep: None,
            saved: None,
        }))
    }

    fn forwards(&self) -> bool {
        true
    }
}

fn all_thinking_modes() -> Vec<ThinkingMode> {
    vec![ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled]
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, LoadError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LoadError::Refused { message: format!("no free loopback port: {e}") })
}
