//! `cargo xtask`: project automation that `cargo test` alone cannot do.
//!
//! - `cargo xtask test`: run the whole test suite (what `.ci/run` runs after fmt and clippy).
//! - `cargo xtask bench control-plane`: scheduler throughput, admission overhead and
//!   load+unload cycle time on the stub backend, each next to a same-run reference.
//!
//! Later subcommands (fixtures, e2e runs with real clients) live here too.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Hangar project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Run every test of the workspace (unit, property, fixture and CLI tests).
    Test {
        /// Extra arguments passed to `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run a benchmark; it prints its figures next to a reference measured in the same run.
    Bench {
        /// Which benchmark.
        #[arg(value_enum)]
        which: Bench,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Bench {
    /// The runtime manager on the stub backend (crates/hangar-runtime/benches/control_plane.rs).
    ControlPlane,
}

fn main() -> Result<()> {
    let root = workspace_root();
    match Cli::parse().command {
        Task::Test { args } => test(&root, &args),
        Task::Bench { which: Bench::ControlPlane } => {
            let mut cmd = cargo(&root);
            cmd.args(["bench", "--locked", "-p", "hangar-runtime", "--bench", "control_plane"]);
            run(cmd)
        }
    }
}

fn test(root: &Path, args: &[String]) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args(["test", "--workspace", "--locked"]);
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

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}
