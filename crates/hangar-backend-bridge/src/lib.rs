//! Hangar's Python-bridge engines.
//!
//! This crate owns the backends whose engines live in Python — `ct2` (CTranslate2),
//! `exllamav3` (ExLlamaV3) and in-process `vllm` — and the protocol Hangar speaks with them:
//!
//! - [`BridgeBackend`]: one worker process per replica, started under the subprocess
//!   supervisor of `hangar-supervisor` (own process group, output into the model's log,
//!   SIGKILL when Hangar dies) with `bridge_python`, connected over a private Unix socket;
//!   a preflight that names a missing Python package before anything is evicted;
//! - the versioned JSON-lines protocol ([`protocol`], `PROTOCOL.md`): `hello`, `load`,
//!   streamed `generate`, `embed`, `rerank`, `cancel`, `ping`, `sleep`, `wake`, `unload`,
//!   `shutdown`, errors with a code;
//! - crash detection: a worker that dies, writes garbage, answers what was not asked, or
//!   stops answering pings is a crashed backend (the model moves to `failed` with the reason
//!   and the worker's last output; requests in flight end with `backend_crashed`);
//! - the reference worker (`worker/hangar_bridge/`, compiled in and written out to a
//!   private directory on first use), with one adapter per engine;
//! - sleep and wake for in-process `vllm` with `vllm_enable_sleep_mode` (vLLM's levels 1 and 2).
//!
//! Prompts are rendered here, by [`hangar_prompt`], for every format but `auto`
//! (the engine applies the model's own chat template for that one).

pub mod protocol;
mod runtime;
mod session;
mod worker;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use hangar_backend::{
    Backend, Capabilities, LoadError, LoadRequest, Runtime, SleepLevel, ThinkingMode,
};
use hangar_config::{BackendKind, BackendSettings, ModelConfig, PromptFormat};
use hangar_supervisor::{STOP_GRACE, Spawner};
use serde_json::{Map, Value};
use tokio::net::UnixListener;

use crate::protocol::{LoadModel, Op, PROTOCOL_VERSION, Reply};
use crate::runtime::BridgeRuntime;
use crate::session::Session;
pub use crate::worker::WorkerProgram;
use crate::worker::{PrivateDir, python};

/// How often a loaded worker is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(2);

/// How long a ping may go unanswered before the worker counts as hung.
pub const PING_DEADLINE: Duration = Duration::from_secs(20);

/// How long the preflight check of a worker's packages may take.
const CHECK_DEADLINE: Duration = Duration::from_secs(60);

/// Timings of a bridge backend (tests shorten them).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Ping period of a loaded worker.
    pub ping_every: Duration,
    /// Deadline of one ping.
    pub ping_deadline: Duration,
    /// SIGTERM → SIGKILL grace when a worker is stopped.
    pub grace: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self { ping_every: PING_EVERY, ping_deadline: PING_DEADLINE, grace: STOP_GRACE }
    }
}

/// Default longest protocol line read from a worker: an answer of embeddings for thousands
/// of inputs is large, and no answer is larger than the forwarded answers' bound.
const DEFAULT_MAX_LINE_BYTES: usize = hangar_config::DEFAULT_MAX_ANSWER_BYTES as usize;

/// The engine of `ct2`, `exllamav3` or `vllm` models: a Python worker per replica.
pub struct BridgeBackend {
    kind: BackendKind,
    spawner: Arc<Spawner>,
    program: Option<WorkerProgram>,
    prepared: OnceLock<Result<(Arc<PrivateDir>, WorkerProgram), String>>,
    timing: Timing,
    /// Longest protocol line read from a worker.
    max_line_bytes: usize,
}

impl BridgeBackend {
    /// The engine for `kind` (`Ct2`, `ExLlamaV3` or `Vllm`) with the reference worker.
    pub fn new(kind: BackendKind) -> Self {
        Self {
            kind,
            spawner: Spawner::new(),
            program: None,
            prepared: OnceLock::new(),
            timing: Timing::default(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }

    /// The same engine reading protocol lines of at most `bytes` from its workers
    /// (`limits.max_answer_bytes`): a worker that writes a longer one is declared dead and
    /// its model failed, without the line held.
    pub fn with_max_line_bytes(mut self, bytes: u64) -> Self {
        self.max_line_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        self
    }

    /// The same engine running another worker program (the test worker).
    pub fn with_worker(mut self, program: WorkerProgram) -> Self {
        self.program = Some(program);
        self
    }

    /// The same engine whose workers get the variables of Hangar's environment that
    /// `inherit` passes (`children`), never `HANGAR_*`.
    pub fn with_child_env(mut self, inherit: hangar_config::ChildEnv) -> Self {
        self.spawner = Spawner::with_env(inherit);
        self
    }

    /// The same engine with other timings.
    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// The engine's name on the wire (`ct2`, `exllamav3`, `vllm`).
    fn engine(&self) -> &'static str {
        self.kind.as_str()
    }

    /// The private directory and the worker program, created on first use.
    fn prepared(&self) -> Result<(Arc<PrivateDir>, WorkerProgram), LoadError> {
        let prepared = self.prepared.get_or_init(|| {
            let dir = PrivateDir::create()
                .map_err(|e| format!("cannot create a private directory: {e}"))?;
            let program = match &self.program {
                Some(program) => program.clone(),
                None => WorkerProgram::reference(dir.path())
                    .map_err(|e| format!("cannot write the bridge worker: {e}"))?,
            };
            Ok((Arc::new(dir), program))
        });
        prepared.clone().map_err(|message| LoadError::Refused { message })
    }
}

#[async_trait]
impl Backend for BridgeBackend {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn capabilities(&self, model: &ModelConfig) -> Capabilities {
        capabilities(model)
    }

    /// Checks the interpreter, the model directory and the engine's packages (the worker's
    /// `--check`, which finds packages without importing them) before anything is evicted.
    async fn preflight(&self, model: &ModelConfig) -> Result<(), LoadError> {
        let python = python(bridge_python(model))?;
        if self.kind != BackendKind::Vllm
            && let Some(path) = &model.model_path
            && !std::path::Path::new(path).exists()
        {
            return Err(LoadError::NotFound {
                path: path.clone(),
                message: format!("model_path `{path}` does not exist"),
            });
        }
        let (_, program) = self.prepared()?;
        let launch = program.launch(&python, &["--check", self.engine()]);
        let output = tokio::process::Command::new(&launch.program)
            .args(&launch.args)
            .env_clear()
            .envs(self.spawner.environment(&model.pass_env, &launch.env))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = match tokio::time::timeout(CHECK_DEADLINE, output).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => {
                return Err(LoadError::Refused { message: format!("cannot run `{python}`: {e}") });
            }
            Err(_) => {
                return Err(LoadError::Refused {
                    message: format!(
                        "`{python}` did not finish the package check in {CHECK_DEADLINE:?}"
                    ),
                });
            }
        };
        if output.status.success() {
            return Ok(());
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let answer = stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok());
        let field = |key: &str| answer.as_ref().and_then(|a| a.get(key)).and_then(Value::as_str);
        match (field("code"), field("message")) {
            (Some("missing_package"), Some(message)) => Err(LoadError::NotFound {
                path: field("package").unwrap_or("?").to_owned(),
                message: message.to_owned(),
            }),
            (_, Some(message)) => Err(LoadError::Refused { message: message.to_owned() }),
            _ => Err(LoadError::Refused {
                message: format!(
                    "the bridge worker's package check under `{python}` failed ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            }),
        }
    }

    async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        let LoadRequest { model, replica, replicas, progress, crash, logs, gpus, .. } = request;
        let python = python(bridge_python(&model))?;
        let (dir, program) = self.prepared()?;
        let socket = dir.socket();
        let listener = UnixListener::bind(&socket).map_err(|e| LoadError::Refused {
            message: format!("cannot listen on {}: {e}", socket.display()),
        })?;
        let socket_arg = socket.to_string_lossy().into_owned();
        let mut launch = program.launch(&python, &["--socket", &socket_arg]);
        launch.pass_env.clone_from(&model.pass_env);
        let placed = hangar_backend::cuda_environment(&gpus, &launch.env);
        launch.env.extend(placed);
        let name = model.name.as_str();
        let child = self.spawner.spawn(&launch, name, replica, &logs).await.map_err(|e| {
            LoadError::Refused {
                message: format!("cannot start the bridge worker `{python}`: {e}"),
            }
        })?;
        let child = Arc::new(child);
        let failed = |why: String| LoadError::Failed { message: format!("bridge worker: {why}") };
        let start = async {
            let stream = tokio::select! {
                accepted = listener.accept() => {
                    accepted.map_err(|e| failed(format!("accept failed: {e}")))?.0
                }
                status = child.wait() => return Err(failed(child.obituary(&status))),
            };
            let session = Session::start_within(stream, self.max_line_bytes);
            let hello = handshake(&session).await.map_err(failed)?;
            progress.report(0.1);
            let op = Op::Load {
                engine: self.engine().to_owned(),
                model: load_model(&model, replica, replicas),
            };
            match session.call(&op).finish().await {
                Ok(Reply::Loaded { max_parallel_sequences, details }) => {
                    Ok((session, hello, max_parallel_sequences, details))
                }
                Ok(Reply::Error { code, message, package }) => {
                    Err(load_error(&model, &code, message, package))
                }
                Ok(other) => Err(failed(format!("the worker answered load with {other:?}"))),
                Err(reason) => Err(failed(reason)),
            }
        };
        let outcome = tokio::time::timeout(model.load_timeout(), start).await;
        let _ = std::fs::remove_file(&socket);
        let (session, hello, max_parallel, worker_details) = match outcome {
            Ok(Ok(started)) => started,
            Ok(Err(error)) => {
                child.stop(self.timing.grace).await;
                return Err(error);
            }
            Err(_) => {
                child.stop(self.timing.grace).await;
                return Err(failed(format!(
                    "did not load the model within load_timeout_s ({:?})",
                    model.load_timeout()
                )));
            }
        };
        progress.report(1.0);
        let mut capabilities = capabilities(&model);
        if let Some(n) = max_parallel.and_then(std::num::NonZeroU32::new) {
            capabilities.max_parallel_sequences = Some(n);
        }
        let mut details = Map::new();
        details.insert("pid".into(), Value::from(child.pid()));
        details.insert("python".into(), Value::from(python.clone()));
        details.insert("worker".into(), Value::from(hello));
        details.insert("protocol".into(), Value::from(PROTOCOL_VERSION));
        details.extend(worker_details);
        session.watch_liveness(self.timing.ping_every, self.timing.ping_deadline);
        Ok(BridgeRuntime::start(runtime::Parts {
            session,
            child,
            capabilities,
            details,
            prompt_format: model.prompt_format.unwrap_or(PromptFormat::Auto),
            stopping: Arc::new(AtomicBool::new(false)),
            grace: self.timing.grace,
            crash,
            _keep: (Arc::clone(&self.spawner), dir),
        }))
    }
}

/// Opens the session: the worker's protocol must be ours. The worker's name and version.
async fn handshake(session: &Arc<Session>) -> Result<String, String> {
    match session.call(&Op::Hello { protocol: PROTOCOL_VERSION }).finish().await? {
        Reply::Hello { protocol, worker, worker_version, python, engines } => {
            if protocol != PROTOCOL_VERSION {
                return Err(format!(
                    "protocol version mismatch: the worker speaks version {protocol}, this Hangar speaks version {PROTOCOL_VERSION}"
                ));
            }
            tracing::debug!(%worker, %worker_version, %python, ?engines, "bridge worker ready");
            Ok(format!("{worker} {worker_version} (Python {python})").trim().to_owned())
        }
        Reply::Error { code, message, .. } => Err(format!("hello failed: {code}: {message}")),
        other => Err(format!("the worker answered hello with {other:?}")),
    }
}

/// A load's error reply as a load error: a missing package or model is not-found (nothing
/// is evicted to retry it), anything else a failure with the worker's code.
fn load_error(
    model: &ModelConfig,
    code: &str,
    message: String,
    package: Option<String>,
) -> LoadError {
    match code {
        "missing_package" => LoadError::NotFound { path: package.unwrap_or_default(), message },
        "not_found" => {
            LoadError::NotFound { path: model.model_path.clone().unwrap_or_default(), message }
        }
        _ => LoadError::Failed { message: format!("bridge worker: {code}: {message}") },
    }
}

/// `bridge_python` of a bridge model.
fn bridge_python(model: &ModelConfig) -> Option<&str> {
    match &model.settings {
        BackendSettings::Ct2 { bridge, .. }
        | BackendSettings::ExLlamaV3 { bridge, .. }
        | BackendSettings::Vllm { bridge, .. } => bridge.bridge_python.as_deref(),
        _ => None,
    }
}

/// What the worker's `load` needs of the effective definition.
fn load_model(model: &ModelConfig, replica: u32, replicas: u32) -> LoadModel {
    let section = match &model.settings {
        BackendSettings::Ct2 { ct2, .. } => serde_json::to_value(ct2),
        BackendSettings::ExLlamaV3 { exllama, .. } => serde_json::to_value(exllama),
        BackendSettings::Vllm { engine, .. } => serde_json::to_value(engine),
        _ => Ok(Value::Null),
    };
    let mut settings = match section {
        Ok(Value::Object(fields)) => fields,
        _ => Map::new(),
    };
    settings.retain(|_, v| !v.is_null());
    let gpu = model.device.contains(hangar_config::Device::GPU);
    LoadModel {
        name: model.name.to_string(),
        model_path: model.model_path.clone(),
        model_type: model.model_type.as_str().to_owned(),
        prompt_format: model.prompt_format.unwrap_or(PromptFormat::Auto).as_str().to_owned(),
        device: if gpu { "gpu" } else { "cpu" }.to_owned(),
        target_inflight: model.target_inflight.get(),
        replica,
        replicas,
        settings,
    }
}

/// Capabilities from the config alone: multi-turn per the prompt format, the three thinking
/// modes where the spec lists a safe per-request control (CT2 Qwen 3, ExLlamaV3 and vLLM
/// Gemma 4 / Qwen 3), recognised by the prompt format or, for `auto`, the model path, and
/// vLLM's two sleep levels for a `vllm` model with `vllm_enable_sleep_mode`.
pub fn capabilities(model: &ModelConfig) -> Capabilities {
    let format = model.prompt_format.unwrap_or(PromptFormat::Auto);
    let path = model.model_path.as_deref().unwrap_or_default().to_ascii_lowercase();
    let named = |families: &[&str]| families.iter().any(|f| path.contains(f));
    let thinks = match (model.backend, format) {
        (_, PromptFormat::Qwen3Template) => true,
        (BackendKind::ExLlamaV3 | BackendKind::Vllm, PromptFormat::Gemma4Template) => true,
        (BackendKind::Ct2, PromptFormat::Auto) => named(&["qwen3"]),
        (BackendKind::ExLlamaV3 | BackendKind::Vllm, PromptFormat::Auto) => {
            named(&["qwen3", "gemma-4", "gemma4"])
        }
        _ => false,
    };
    let mut caps =
        Capabilities { multi_turn: hangar_prompt::multi_turn(format), ..Capabilities::default() };
    if let BackendSettings::Ct2 { ct2, .. } = &model.settings {
        // One generation per inter-op thread; more queue inside CTranslate2.
        caps.max_parallel_sequences = std::num::NonZeroU32::new(ct2.ct2_inter_threads.unwrap_or(1));
    }
    if thinks {
        caps.thinking_modes =
            vec![ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled];
    }
    if let BackendSettings::Vllm { engine, .. } = &model.settings
        && engine.sleeps()
    {
        caps.sleep_levels = vec![SleepLevel::WeightsToHost, SleepLevel::WeightsDiscarded];
    }
    caps
}
