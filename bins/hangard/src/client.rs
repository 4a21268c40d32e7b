//! `hangard ps | load | unload`: a small client of a running server's admin API.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Map, Value};

/// Where the server is and how to authenticate.
#[derive(Debug, Args)]
pub(crate) struct Remote {
    /// Base URL of the running server.
    #[arg(long, env = "HANGAR_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Admin key, sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "HANGAR_ADMIN_KEY", hide_env_values = true)]
    admin_api_key: Option<String>,
}

/// `hangard ps`.
#[derive(Debug, Args)]
pub(crate) struct PsArgs {
    #[command(flatten)]
    remote: Remote,
    /// Print the server's JSON as it came.
    #[arg(long)]
    json: bool,
}

/// `hangard load`.
#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// The configured model to load.
    name: String,
    /// Replicas for this load (at most the model's `replica_max`).
    #[arg(long)]
    replicas: Option<NonZeroU32>,
    /// A runtime-only load override, e.g. `--set gguf_n_ctx=8192`; the value is read as
    /// JSON when it parses (`null`, numbers, booleans), else as a string. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_override)]
    overrides: Vec<(String, Value)>,
    #[command(flatten)]
    remote: Remote,
}

/// `hangard unload`.
#[derive(Debug, Args)]
pub(crate) struct UnloadArgs {
    /// The configured model to unload.
    name: String,
    #[command(flatten)]
    remote: Remote,
}

fn parse_override(arg: &str) -> Result<(String, Value), String> {
    let (key, value) = arg.split_once('=').ok_or("expected KEY=VALUE")?;
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok((key.to_owned(), value))
}

/// Prints the model table (or the raw JSON).
pub(crate) fn ps(args: PsArgs) -> Result<ExitCode> {
    let reply = block_on(args.remote.request(reqwest::Method::GET, "/v1/admin/models", None))??;
    let body = match reply {
        Ok(body) => body,
        Err(failure) => return Ok(failure.report()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        let models = body["models"].as_array().map(Vec::as_slice).unwrap_or_default();
        print!("{}", table(models));
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads a model and prints the state it reached.
pub(crate) fn load(args: LoadArgs) -> Result<ExitCode> {
    let mut body = Map::new();
    if let Some(n) = args.replicas {
        body.insert("replicas".into(), n.get().into());
    }
    body.extend(args.overrides);
    let path = format!("/v1/admin/models/{}/load", encode_segment(&args.name));
    let reply = args.remote.request(reqwest::Method::POST, &path, Some(Value::Object(body)));
    print_model(block_on(reply)??)
}

/// Unloads a model and prints the state it reached.
pub(crate) fn unload(args: UnloadArgs) -> Result<ExitCode> {
    let path = format!("/v1/admin/models/{}/unload", encode_segment(&args.name));
    print_model(block_on(args.remote.request(reqwest::Method::POST, &path, None))??)
}

fn print_model(reply: Result<Value, Failure>) -> Result<ExitCode> {
    let model = match reply {
        Ok(model) => model,
        Err(failure) => return Ok(failure.report()),
    };
    let text = |key: &str| model[key].as_str().unwrap_or("?").to_owned();
    println!(
        "{}: {} ({}/{} replicas)",
        text("name"),
        text("runtime_state"),
        model["loaded_replicas"],
        model["replicas"]
    );
    if let Some(o) = model["load_override"].as_object().filter(|o| !o.is_empty()) {
        println!("load override: {}", Value::Object(o.clone()));
    }
    if let Some(error) = model["last_error"].as_str() {
        println!("last error: {error}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A non-2xx answer: its status and the envelope's code and message.
struct Failure {
    status: reqwest::StatusCode,
    code: String,
    message: String,
}

impl Failure {
    fn report(&self) -> ExitCode {
        eprintln!("error: {} ({}): {}", self.code, self.status, self.message);
        ExitCode::FAILURE
    }
}

impl Remote {
    /// Sends one request. `Err` only when the server cannot be reached or answers garbage;
    /// an error answer is `Ok(Err(Failure))`.
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<Value, Failure>> {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let mut request = reqwest::Client::new().request(method.clone(), &url);
        if let Some(key) = self.admin_api_key.as_deref().filter(|k| !k.is_empty()) {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("cannot reach {url}"))?;
        let status = response.status();
        let bytes = response.bytes().await.with_context(|| format!("{method} {url}"))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Ok(value));
        }
        let error = &value["error"];
        let code = error["code"].as_str().unwrap_or("http_error").to_owned();
        let message = match error {
            Value::Object(e) => e.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
            Value::String(s) => s.clone(),
            _ => String::from_utf8_lossy(&bytes).into_owned(),
        };
        Ok(Err(Failure { status, code, message }))
    }
}

fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    Ok(runtime.block_on(future))
}

/// The `ps` table: one row per model, columns padded to their widest cell.
fn table(models: &[Value]) -> String {
    let header =
        ["NAME", "TYPE", "BACKEND", "STATE", "REPLICAS", "INFLIGHT", "QUEUE", "LAST ERROR"];
    let cell = |m: &Value, key: &str| match &m[key] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for m in models {
        rows.push(vec![
            cell(m, "name"),
            cell(m, "type"),
            cell(m, "resolved_backend"),
            cell(m, "runtime_state"),
            format!("{}/{}", cell(m, "loaded_replicas"), cell(m, "replicas")),
            cell(m, "inflight_requests"),
            cell(m, "queue_depth"),
            cell(m, "last_error"),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let last = row.len() - 1;
        for (i, value) in row.iter().enumerate() {
            if i == last {
                let _ = writeln!(out, "{value}");
            } else {
                let _ = write!(out, "{value:<width$}  ", width = widths[i]);
            }
        }
    }
    out
}

/// Percent-encodes a path segment: everything but RFC 3986 unreserved characters.
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char);
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn override_values_are_json_when_they_parse_else_strings() {
        let cases = [
            ("gguf_n_ctx=8192", json!(8192)),
            ("exllama_cache_quant=null", Value::Null),
            ("exllama_cache_quant=8,4", json!("8,4")),
            ("gguf_type_k=q8_0", json!("q8_0")),
            ("llama_server_spec_draft_p_min=0.25", json!(0.25)),
            ("x=\"42\"", json!("42")),
            ("x=", json!("")),
            ("x=a=b", json!("a=b")),
        ];
        for (arg, value) in cases {
            let (key, parsed) = parse_override(arg).unwrap();
            assert_eq!(parsed, value, "{arg}");
            assert_eq!(key, arg.split('=').next().unwrap());
        }
        assert!(parse_override("novalue").is_err());
        assert!(parse_override("=1").is_err());
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("qwen3-8b_Q4.gguf~x"), "qwen3-8b_Q4.gguf~x");
        assert_eq!(encode_segment("qwen3:8b"), "qwen3%3A8b");
        assert_eq!(encode_segment("a b?c#d%e"), "a%20b%3Fc%23d%25e");
        assert_eq!(encode_segment("modèle"), "mod%C3%A8le");
    }

    #[test]
    fn the_table_pads_columns_and_shows_missing_values_as_dashes() {
        let models = [
            json!({"name": "chat", "type": "llm", "resolved_backend": "stub",
                   "runtime_state": "loaded", "loaded_replicas": 2, "replicas": 2,
                   "inflight_requests": 1, "queue_depth": 0, "last_error": null}),
            json!({"name": "broken-model", "type": "llm", "resolved_backend": "stub",
                   "runtime_state": "failed", "loaded_replicas": 0, "replicas": 1,
                   "inflight_requests": 0, "queue_depth": 0, "last_error": "out of memory"}),
        ];
        let text = table(&models);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAME          TYPE  BACKEND  STATE   REPLICAS"), "{text}");
        assert!(lines[1].starts_with("chat          llm   stub     loaded  2/2"), "{text}");
        assert!(lines[1].ends_with("  -"), "{text}");
        assert!(lines[2].ends_with("  out of memory"), "{text}");
    }
}
