//! `hangard`: the Hangar server binary and its command-line tools.
//!
//! Composition root only: argument parsing and output. The config logic lives in
//! `hangar-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod config_cmd;

/// Hangar: load, unload, evict and inspect LLM, embedding and reranking models at runtime.
#[derive(Debug, Parser)]
#[command(name = "hangard", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
