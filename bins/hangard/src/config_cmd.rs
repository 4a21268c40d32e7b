//! `hangard config …`: check and schema.

use std::path::Path;
use std::process::ExitCode;

use hangar_config::{Config, ConfigError};
use serde_json::json;

/// `hangard config check`: prints the effective config (and on stderr a `warning:` line for
/// each model type with more enabled models than slots), or every problem and exits 1.
pub(crate) fn check(dir: &Path, json: bool, raw: bool) -> anyhow::Result<ExitCode> {
    let loaded = hangar_config::read_merged(dir).and_then(|merged| {
        let config = Config::from_value(&merged)?;
        Ok((merged, config))
    });
    match loaded {
        Ok((merged, config)) => {
            let warnings: Vec<String> =
                config.slot_warnings().iter().map(ToString::to_string).collect();
            if !json {
                for warning in &warnings {
                    eprintln!("warning: {warning}");
                }
            }
            let shown = if raw { merged } else { config.to_effective_json() };
            let out = if json {
                json!({ "valid": true, "warnings": warnings, "config": shown })
            } else {
                shown
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            report(dir, &err, json)?;
            Ok(ExitCode::FAILURE)
        }
    }
}

fn report(dir: &Path, err: &ConfigError, json: bool) -> anyhow::Result<()> {
    let problems: Vec<(String, String)> = match err {
        ConfigError::Invalid(errors) => {
            errors.iter().map(|e| (e.path.clone(), e.message.clone())).collect()
        }
        other => vec![(String::new(), other.to_string())],
    };
    if json {
        let errors: Vec<_> = problems
            .iter()
            .map(|(path, message)| json!({ "path": path, "message": message }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "valid": false, "errors": errors }))?);
    } else {
        for (path, message) in &problems {
            match path.is_empty() {
                true => eprintln!("error: {message}"),
                false => eprintln!("error: {path}: {message}"),
            }
        }
        let n = problems.len();
        eprintln!("{n} problem{} in {}", if n == 1 { "" } else { "s" }, dir.display());
    }
    Ok(())
}

/// `hangard config schema`: prints the JSON Schema of the merged config.
pub(crate) fn schema() -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(&hangar_config::config_schema())?);
    Ok(ExitCode::SUCCESS)
}
