//! `hangard`: the Hangar server binary and its command-line tools.
//!
//! Composition root only: argument parsing, dispatch and output. The config logic lives in
//! `hangar-config`, the control plane in `hangar-runtime`, HTTP in `hangar-server`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod client;
mod config_cmd;
mod keys;
mod model_flags;
mod nofile;
mod serve;

/// Hangar: load, unload, evict and inspect LLM, embedding and reranking models at runtime.
#[derive(Debug, Parser)]
#[command(name = "hangard", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server until SIGINT or SIGTERM, then drain in-flight requests and exit.
    Serve(serve::ServeArgs),
    /// List the models of a running server with their live state.
    Ps(client::PsArgs),
    /// Load a model on a running server and print its state.
    Load(client::LoadArgs),
    /// Gracefully unload a model on a running server and print its state.
    Unload(client::UnloadArgs),
    /// Print a model's recent engine output (`--follow` keeps printing new lines).
    Logs(client::LogsArgs),
    /// Inspect and validate configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Merge settings.json with local.json, validate, and print the effective config; on
    /// problems, print every one with its JSON path and exit 1.
    Check {
        /// Config directory holding settings.json and optionally local.json.
        #[arg(long, short, value_name = "DIR", env = "HANGAR_CONFIG")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Print the merged JSON exactly as written, before defaults (secrets included),
        /// instead of the effective config.
        #[arg(long)]
        raw: bool,
    },
    /// Print the JSON Schema of the merged config.
    Schema,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Human-readable.
    Text,
    /// One JSON document on stdout.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Ps(args) => client::ps(args),
        Command::Load(args) => client::load(args),
        Command::Unload(args) => client::unload(args),
        Command::Logs(args) => client::logs(args),
        Command::Config(ConfigCommand::Check { config, format, raw }) => {
            config_cmd::check(&config, format == Format::Json, raw)
        }
        Command::Config(ConfigCommand::Schema) => config_cmd::schema(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hangard: {e:#}");
            ExitCode::FAILURE
        }
    }
}
