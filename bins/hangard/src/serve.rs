//! `hangard serve`: the composition root of the server — config with CLI overrides, the
//! compiled-in engines, logging, the listener, signals and the graceful drain.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use hangar_backend_bridge::BridgeBackend;
use hangar_backend_process::{ProcessBackend, RemoteBackend};
use hangar_config::{
    BackendKind, ChildEnv, Config, ConfigError, MaxLoadedModels, ModelName, Secret, ValidationError,
};
use hangar_runtime::{Backends, Manager};
use hangar_server::{HangarService, ServerOptions};
use hangar_stub::StubBackend;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing_subscriber::EnvFilter;

use crate::model_flags::{ModelFlags, apply_model_flags};

/// `hangard serve` options. A flag given on the command line wins over the config.
#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// Config directory holding settings.json and optionally local.json.
    #[arg(long, short, value_name = "DIR", env = "HANGAR_CONFIG")]
    config: PathBuf,
    /// Address to listen on (overrides `host`).
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on (overrides `port`); 0 picks a free port.
    #[arg(long)]
    port: Option<u16>,
    /// Port of the KServe v2 / Triton gRPC listener on the same host (overrides
    /// `grpc_port`, default 8001); 0 turns it off.
    #[arg(long, env = "HANGAR_GRPC_PORT")]
    grpc_port: Option<u16>,
    /// Loaded-model slots per type (overrides `max_loaded_models`); missing types get 1.
    #[arg(long, num_args = 1..=3, value_names = ["LLMS", "EMBEDDINGS", "RERANKINGS"])]
    max_loaded_models: Option<Vec<u32>>,
    /// Load models on their first request (overrides `auto_load`; `--auto-load=false` turns
    /// it off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    auto_load: Option<bool>,
    /// Bearer key the admin routes require (overrides `admin_api_key`). Any local user can
    /// read a command line: prefer `--admin-api-key-file` or the variable.
    #[arg(long, env = "HANGAR_ADMIN_KEY", hide_env_values = true)]
    admin_api_key: Option<String>,
    /// A file whose first line is the admin key (overrides `admin_api_key`).
    #[arg(
        long,
        value_name = "PATH",
        env = "HANGAR_ADMIN_KEY_FILE",
        conflicts_with = "admin_api_key"
    )]
    admin_api_key_file: Option<std::path::PathBuf>,
    /// A file of inference keys, one per line (blank lines and `#` comments skipped);
    /// replaces `inference_api_keys`, and adds to `--inference-api-key`.
    #[arg(long, value_name = "PATH", env = "HANGAR_INFERENCE_KEYS_FILE")]
    inference_api_key_file: Option<std::path::PathBuf>,
    /// A bearer key the inference routes accept (repeat the flag, or separate keys with
    /// commas in the variable); replaces `inference_api_keys`. The admin key opens them too.
    #[arg(
        long = "inference-api-key",
        value_name = "KEY",
        env = "HANGAR_INFERENCE_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    inference_api_keys: Vec<String>,
    /// Listen beyond loopback without an admin key: anyone who reaches the port can then
    /// load, unload and reconfigure models. Without this flag such a start is refused.
    #[arg(long)]
    insecure_no_admin_key: bool,
    /// Log line format (on stderr). The filter comes from `RUST_LOG`, default `info`.
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    #[command(flatten)]
    models: ModelFlags,
}

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Pretty,
}

/// Runs the server until SIGINT or SIGTERM, then drains and exits 0. A second signal during
/// the drain exits at once with status 1. `SIGHUP` re-reads the config and applies its
/// models (as `POST /v1/admin/config/reload`).
pub(crate) fn run(args: ServeArgs) -> Result<ExitCode> {
    init_logging(args.log_format);
    let config = effective_config(&args)?;
    let reread = args.clone();
    let source = hangar_server::ConfigSource::new(&config, move || reread_config(&reread));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let code = runtime.block_on(serve(config, source, args.insecure_no_admin_key));
    // Tasks still running (a stalled connection past the shutdown bound) are dropped, not
    // waited for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Pretty => logs.init(),
    }
}

/// The config as a reload reads it: the directory's files with the command line's overrides
/// (which were checked at start), every problem reported as a config error.
fn reread_config(args: &ServeArgs) -> Result<Config, ConfigError> {
    let config = Config::load(&args.config)?;
    with_flags(args, config).map_err(|e| {
        let message = format!("{e:#}");
        ConfigError::Invalid(vec![ValidationError { path: "command line".into(), message }])
    })
}

/// The config directory's settings with the command line's overrides applied.
fn effective_config(args: &ServeArgs) -> Result<Config> {
    let dir = &args.config;
    let config =
        Config::load(dir).with_context(|| format!("cannot use the config in {}", dir.display()))?;
    for flag in crate::keys::keys_on_the_command_line(std::env::args()) {
        tracing::warn!(
            "{flag} puts a key on the command line, which every local user can read in /proc; use {flag}-file or its environment variable"
        );
    }
    with_flags(args, config)
}

/// `config` with the command line's overrides applied.
fn with_flags(args: &ServeArgs, mut config: Config) -> Result<Config> {
    if let Some(host) = &args.host {
        config.host.clone_from(host);
    }
    if let Some(port) = args.port {
        config.port = port;
    }
    if let Some(port) = args.grpc_port {
        config.grpc_port = port;
    }
    if let Some(counts) = &args.max_loaded_models {
        config.max_loaded_models = MaxLoadedModels::from_counts(counts)
            .map_err(|e| anyhow::anyhow!("--max-loaded-models: {e}"))?;
    }
    if let Some(auto_load) = args.auto_load {
        config.auto_load = auto_load;
    }
    if let Some(key) = args.admin_api_key.as_deref().filter(|k| !k.is_empty()) {
        config.admin_api_key = Some(Secret::new(key));
    }
    if let Some(path) = &args.admin_api_key_file {
        let keys = crate::keys::read_key_file(path)
            .map_err(|e| anyhow::anyhow!("--admin-api-key-file: {e}"))?;
        config.admin_api_key = keys.into_iter().next().map(Secret::new);
    }
    let mut inference: Vec<Secret> =
        args.inference_api_keys.iter().filter(|k| !k.is_empty()).map(Secret::new).collect();
    if let Some(path) = &args.inference_api_key_file {
        let keys = crate::keys::read_key_file(path)
            .map_err(|e| anyhow::anyhow!("--inference-api-key-file: {e}"))?;
        inference.extend(keys.iter().map(Secret::new));
    }
    if !inference.is_empty() {
        config.inference_api_keys = inference;
    }
    let kept = apply_model_flags(&mut config, &args.models)?;
    if let (Some(build), false) = (&args.models.llamacpp, kept.is_empty()) {
        let models: Vec<&str> = kept.iter().map(ModelName::as_str).collect();
        tracing::warn!(
            llamacpp = %build,
            models = %models.join(", "),
            "these llama_server models have no such build in llama_server_backends and keep their binary"
        );
    }
    Ok(config)
}

/// The engines compiled into this build. Models of other backends fail to load with
/// `backend_unavailable`. Engine children get the part of Hangar's environment that
/// `children` passes; bridge workers' protocol lines are bounded by `max_answer_bytes`, as
/// forwarded answers are.
fn backends(children: &ChildEnv, max_answer_bytes: u64) -> Backends {
    let bridge = |kind| {
        let bridge = BridgeBackend::new(kind).with_child_env(children.clone());
        bridge.with_max_line_bytes(max_answer_bytes)
    };
    let backends = Backends::new()
        .with(Arc::new(StubBackend::new()))
        .with(Arc::new(ProcessBackend::llama_server().with_child_env(children.clone())))
        .with(Arc::new(ProcessBackend::vllm_serve().with_child_env(children.clone())))
        .with(Arc::new(RemoteBackend))
        .with(Arc::new(bridge(BackendKind::Ct2)))
        .with(Arc::new(bridge(BackendKind::ExLlamaV3)))
        .with(Arc::new(bridge(BackendKind::Vllm)));
    #[cfg(feature = "llama-cpp")]
    let backends = match llama_backend() {
        Ok(llama) => backends.with(Arc::new(hangar_backend_llamacpp::LlamaCppBackend::new(llama))),
        Err(e) => {
            tracing::error!(error = %e, "llama.cpp failed to initialise; llama_cpp models are unavailable");
            backends
        }
    };
    backends
}

/// llama.cpp's process-wide backend, initialised once per process (it refuses a second init),
/// with llama.cpp's own log lines routed into `tracing` (a process-global hook, so installed
/// here, in the composition root): that is how a failed load gets llama.cpp's reason.
#[cfg(feature = "llama-cpp")]
fn llama_backend() -> Result<Arc<hangar_backend_llamacpp::llama_cpp_2::llama_backend::LlamaBackend>>
{
    use hangar_backend_llamacpp::llama_cpp_2::{self, LogOptions, llama_backend::LlamaBackend};
    static LLAMA: std::sync::OnceLock<Arc<LlamaBackend>> = std::sync::OnceLock::new();
    if let Some(llama) = LLAMA.get() {
        return Ok(Arc::clone(llama));
    }
    llama_cpp_2::send_logs_to_tracing(LogOptions::default());
    let llama = Arc::new(LlamaBackend::init().context("llama.cpp backend init")?);
    Ok(Arc::clone(LLAMA.get_or_init(|| llama)))
}

async fn serve(
    mut config: Config,
    source: hangar_server::ConfigSource,
    insecure_no_admin_key: bool,
) -> Result<ExitCode> {
    // Handlers first: a signal that arrives right after the listening line must drain, not
    // kill the process.
    let mut signals = Signals::install()?;
    // SIGHUP's too: one right after the listening line must reload, not kill the process.
    let hangups = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let addr = listener.local_addr().context("cannot read the bound address")?;
    if !addr.ip().is_loopback() && config.admin_api_key.is_none() {
        if !insecure_no_admin_key {
            anyhow::bail!(
                "refusing to listen on {addr} (beyond loopback, HTTP and gRPC) without an admin \
                 key: anyone who can reach it could load, unload and reconfigure models. Set \
                 admin_api_key, --admin-api-key or HANGAR_ADMIN_KEY, listen on 127.0.0.1, or \
                 pass --insecure-no-admin-key to accept that"
            );
        }
        tracing::warn!(
            %addr,
            "--insecure-no-admin-key: listening beyond loopback without an admin key; anyone \
             who can reach this port can load, unload and reconfigure models"
        );
    }
    let listeners = if config.grpc_port == 0 { 1 } else { 2 };
    crate::nofile::raise(config.connections.max_connections.get(), listeners);
    let max_answer_bytes = config.limits.max_answer_bytes.get();
    let manager = Manager::new(&config, backends(&config.children, max_answer_bytes));
    // NVML, initialised once; without a driver GPU telemetry says why it is unavailable.
    let gpu = hangar_gpu::probe();
    match gpu.read() {
        Ok(gpus) => tracing::info!(gpus = gpus.len(), "GPU telemetry: NVML"),
        Err(e) => tracing::info!(reason = %e.reason, "GPU telemetry unavailable"),
    }
    manager.set_gpu_probe(gpu);
    let mut options = ServerOptions::from_config(&config);
    // The address bound decides the Host rule, whatever name `host` gave.
    options.loopback_listener = addr.ip().is_loopback();
    options.config_source = Some(source);
    let shutdown_timeout = options.http.shutdown_timeout;
    let service = HangarService::new(manager.clone(), options);
    // The manager owns the model definitions from here on; this copy would only hold memory.
    let model_count = std::mem::take(&mut config.models).len();
    let grpc = grpc_listener(&config).await?;
    announce(addr)?;
    tracing::info!(%addr, models = model_count, auto_load = config.auto_load, "listening");

    let loading = tokio::spawn(load_enabled(manager.clone()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stop = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let reloads = tokio::spawn(reload_on_hangup(service.clone(), hangups));
    let mut server =
        tokio::spawn(hangar_server::serve(listener, service.clone(), until_stop(stopped.clone())));
    let mut grpc = grpc.map(|listener| {
        tokio::spawn(hangar_server::grpc::serve(listener, service, until_stop(stopped)))
    });
    tokio::select! {
        ended = &mut server => {
            ended.context("the server task panicked")?.context("the server stopped")?;
            anyhow::bail!("the server stopped without a shutdown signal");
        }
        ended = ended(&mut grpc) => {
            ended.context("the gRPC server task panicked")?.context("the gRPC server stopped")?;
            anyhow::bail!("the gRPC server stopped without a shutdown signal");
        }
        name = signals.next() => {
            tracing::info!(signal = name, "shutting down: no new connections, draining in-flight requests");
        }
    }
    // From here the whole shutdown takes at most `shutdown_timeout`: requests drain for
    // the first part (event streams end at once), engines stop in the rest.
    let deadline = tokio::time::Instant::now() + shutdown_timeout;
    let stop_reserve = (shutdown_timeout / 2).min(STOP_RESERVE);
    let _ = stop.send(true);
    let drained = async {
        let http = server.await.context("the server task panicked")?;
        http.context("the server failed while draining")?;
        if grpc.is_some() {
            let grpc = ended(&mut grpc).await.context("the gRPC server task panicked")?;
            grpc.context("the gRPC server failed while draining")?;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        drained = drained => drained?,
        () = tokio::time::sleep_until(deadline - stop_reserve) => {
            tracing::warn!(
                timeout = ?shutdown_timeout,
                "requests still running at the drain deadline: they are cut off"
            );
        }
        name = signals.next() => {
            tracing::warn!(signal = name, "second signal: exiting without waiting for in-flight requests");
            return Ok(ExitCode::FAILURE);
        }
    }
    // A load still running at shutdown is abandoned; loaded models are released.
    loading.abort();
    reloads.abort();
    tokio::select! {
        unloaded = manager.unload_all() => {
            tracing::info!(models = unloaded.len(), "stopped");
        }
        () = tokio::time::sleep_until(deadline) => {
            // Engine children die with this process (PR_SET_PDEATHSIG).
            tracing::warn!(timeout = ?shutdown_timeout, "engines still stopping at the shutdown deadline: exiting");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The part of the shutdown bound kept for stopping engines (their SIGTERM grace is 10 s),
/// at most half of it.
const STOP_RESERVE: std::time::Duration = std::time::Duration::from_secs(12);

/// The gRPC listener on the HTTP host, unless `grpc_port` is 0. Announced on stdout before
/// the HTTP line, so it is bound once that line is out.
async fn grpc_listener(config: &Config) -> Result<Option<TcpListener>> {
    if config.grpc_port == 0 {
        return Ok(None);
    }
    let listener =
        TcpListener::bind((config.host.as_str(), config.grpc_port)).await.with_context(|| {
            format!(
                "cannot listen for gRPC on {}:{} (--grpc-port 0 turns gRPC off)",
                config.host, config.grpc_port
            )
        })?;
    let addr = listener.local_addr().context("cannot read the bound gRPC address")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "hangard grpc listening on {addr}")?;
    tracing::info!(%addr, "gRPC (KServe v2 / Triton) listening");
    Ok(Some(listener))
}

/// The end of a task that may not exist (never, then).
async fn ended<T>(
    task: &mut Option<tokio::task::JoinHandle<T>>,
) -> Result<T, tokio::task::JoinError> {
    match task {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

/// The one stdout line integration tests and scripts wait for.
fn announce(addr: SocketAddr) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "hangard listening on http://{addr}")?;
    out.flush()?;
    Ok(())
}

/// Loads the enabled models as the start-up plan says (config order, as many of each type
/// as it has slots, none evicting another) and logs what happened to each; a model that
/// fails is logged, not fatal.
async fn load_enabled(manager: Manager) {
    use hangar_runtime::StartUp;
    for (name, outcome) in manager.load_enabled().await {
        match outcome {
            StartUp::Loaded(model) => {
                tracing::info!(model = %name, replicas = model.loaded_replicas, "start-up: enabled model loaded");
            }
            StartUp::NoSlot => tracing::warn!(
                model = %name,
                "start-up: enabled model left unloaded: every slot of its type (max_loaded_models) went to enabled models before it in config order"
            ),
            StartUp::NoRoom(error) => tracing::warn!(
                model = %name,
                %error,
                "start-up: enabled model not loaded: it would have evicted another enabled model"
            ),
            StartUp::Failed(error) => {
                tracing::error!(model = %name, %error, "start-up: enabled model failed to load");
            }
        }
    }
}

/// Re-reads the config on every `SIGHUP` and applies its models; a config with problems
/// changes nothing (each problem is logged).
async fn reload_on_hangup(service: HangarService, mut hangups: Signal) {
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP: re-reading the config");
        match service.reload_config().await {
            Ok(r) => tracing::info!(
                added = ?r.added, removed = ?r.removed, changed = ?r.changed, pending = ?r.pending,
                restart_required = ?r.restart_required, "config reloaded"
            ),
            Err(e) => {
                for problem in e.problems.iter().flatten() {
                    tracing::error!(path = %problem.path, "{}", problem.message);
                }
                tracing::error!(error = %e.message, "config reload refused: nothing changed");
            }
        }
    }
}

/// SIGTERM and SIGINT.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    /// The name of the next signal received.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use std::num::NonZeroU32;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn the_flags_parse_and_read_their_environment_variables() {
        let cli = Cli::try_parse_from([
            "hangard",
            "--config",
            "/c",
            "--ctx-size",
            "4096",
            "--llamacpp-args",
            "--jinja -fa on",
            "--llamacpp",
            "vulkan",
        ])
        .unwrap();
        let flags = &cli.serve.models;
        assert_eq!(flags.ctx_size.map(NonZeroU32::get), Some(4096));
        assert_eq!(flags.llamacpp_args.as_deref(), Some("--jinja -fa on"));
        assert_eq!(flags.llamacpp.as_deref(), Some("vulkan"));
        assert!(Cli::try_parse_from(["hangard", "--config", "/c", "--ctx-size", "0"]).is_err());

        let command = Cli::command();
        let env = |id: &str| {
            let arg = command.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_env().and_then(|e| e.to_str()).map(str::to_owned)
        };
        assert_eq!(env("ctx_size").as_deref(), Some("HANGAR_CTX_SIZE"));
        assert_eq!(env("llamacpp_args").as_deref(), Some("HANGAR_LLAMACPP_ARGS"));
        assert_eq!(env("llamacpp").as_deref(), Some("HANGAR_LLAMACPP"));
    }
}
