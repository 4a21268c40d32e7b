//! `hangard serve`: the composition root of the server — config with CLI overrides, the
//! compiled-in engines, logging, the listener, signals and the graceful drain.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use hangar_backend::stub::StubBackend;
use hangar_config::{Config, MaxLoadedModels, Secret};
use hangar_runtime::{Backends, Manager};
use hangar_server::{HangarService, ServerOptions};
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing_subscriber::EnvFilter;

/// `hangard serve` options. A flag given on the command line wins over the config.
#[derive(Debug, Args)]
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
    /// Loaded-model slots per type (overrides `max_loaded_models`); missing types get 1.
    #[arg(long, num_args = 1..=3, value_names = ["LLMS", "EMBEDDINGS", "RERANKINGS"])]
    max_loaded_models: Option<Vec<u32>>,
    /// Load models on their first request (overrides `auto_load`; `--auto-load=false` turns
    /// it off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    auto_load: Option<bool>,
    /// Bearer key the admin routes require (overrides `admin_api_key`).
    #[arg(long, env = "HANGAR_ADMIN_KEY", hide_env_values = true)]
    admin_api_key: Option<String>,
    /// Log line format (on stderr). The filter comes from `RUST_LOG`, default `info`.
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
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
/// the drain exits at once with status 1.
pub(crate) fn run(args: ServeArgs) -> Result<ExitCode> {
    init_logging(args.log_format);
    let config = effective_config(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(serve(config))
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

/// The config directory's settings with the command line's overrides applied.
fn effective_config(args: &ServeArgs) -> Result<Config> {
    let dir = &args.config;
    let mut config =
        Config::load(dir).with_context(|| format!("cannot use the config in {}", dir.display()))?;
    if let Some(host) = &args.host {
        config.host.clone_from(host);
    }
    if let Some(port) = args.port {
        config.port = port;
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
    Ok(config)
}

/// The engines compiled into this build. Models of other backends fail to load with
/// `backend_unavailable`.
fn backends() -> Backends {
    let backends = Backends::new().with(Arc::new(StubBackend::new()));
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

async fn serve(mut config: Config) -> Result<ExitCode> {
    // Handlers first: a signal that arrives right after the listening line must drain, not
    // kill the process.
    let mut signals = Signals::install()?;
    let manager = Manager::new(&config, backends());
    let service = HangarService::new(manager.clone(), ServerOptions::from_config(&config));
    // The manager owns the model definitions from here on; this copy would only hold memory.
    let model_count = std::mem::take(&mut config.models).len();
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let addr = listener.local_addr().context("cannot read the bound address")?;
    announce(addr)?;
    tracing::info!(%addr, models = model_count, auto_load = config.auto_load, "listening");

    let loading = tokio::spawn(load_enabled(manager.clone()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(hangar_server::serve(listener, service, async {
        let _ = stopped.await;
    }));
    tokio::select! {
        ended = &mut server => {
            ended.context("the server task panicked")?.context("the server stopped")?;
            anyhow::bail!("the server stopped without a shutdown signal");
        }
        name = signals.next() => {
            tracing::info!(signal = name, "shutting down: no new connections, draining in-flight requests");
        }
    }
    let _ = stop.send(());
    tokio::select! {
        ended = &mut server => {
            ended.context("the server task panicked")?.context("the server failed while draining")?;
        }
        name = signals.next() => {
            tracing::warn!(signal = name, "second signal: exiting without waiting for in-flight requests");
            return Ok(ExitCode::FAILURE);
        }
    }
    // A load still running at shutdown is abandoned; loaded models are released.
    loading.abort();
    let unloaded = manager.unload_all().await;
    tracing::info!(models = unloaded.len(), "stopped");
    Ok(ExitCode::SUCCESS)
}

/// The one stdout line integration tests and scripts wait for.
fn announce(addr: SocketAddr) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "hangard listening on http://{addr}")?;
    out.flush()?;
    Ok(())
}

/// Loads every `enabled` model (one after another) and logs each outcome; a model that
/// fails is logged, not fatal.
async fn load_enabled(manager: Manager) {
    for (name, result) in manager.load_enabled().await {
        match result {
            Ok(model) => {
                tracing::info!(model = %name, replicas = model.loaded_replicas, "enabled model loaded");
            }
            Err(error) => tracing::error!(model = %name, %error, "enabled model failed to load"),
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
