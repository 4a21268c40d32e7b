//! `hangard ps | load | unload | logs`: a small client of a running server's admin API.

use std::fmt::Write as _;
use std::io::Write as _;
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

/// `hangard logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The configured model whose engine output to show.
    name: String,
    /// Keep printing new lines as they come, until interrupted.
    #[arg(long, short)]
    follow: bool,
    /// How many of the last lines to print first (the server's default is 100, its most
    /// 2000).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
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

/// Prints a model's last log lines, then with `--follow` every later line as it comes.
pub(crate) fn logs(args: LogsArgs) -> Result<ExitCode> {
    let mut path = format!("/v1/admin/models/{}/logs", encode_segment(&args.name));
    let mut query = Vec::new();
    if let Some(n) = args.tail {
        query.push(format!("tail={n}"));
    }
    if args.follow {
        query.push("follow=true".to_owned());
    }
    if !query.is_empty() {
        let _ = write!(path, "?{}", query.join("&"));
    }
    block_on(async {
        if !args.follow {
            let body = match args.remote.request(reqwest::Method::GET, &path, None).await? {
                Ok(body) => body,
                Err(failure) => return Ok(failure.report()),
            };
            let lines = body["lines"].as_array().map(Vec::as_slice).unwrap_or_default();
            print_lines(lines.iter().map(log_line))?;
            return Ok(ExitCode::SUCCESS);
        }
        let mut response = match args.remote.send(reqwest::Method::GET, &path, None).await? {
            Ok(response) => response,
            Err(failure) => return Ok(failure.report()),
        };
        let mut events = SseEvents::default();
        while let Some(chunk) = response.chunk().await.context("reading the log stream")? {
            let mut lines = Vec::new();
            for data in events.push(&chunk) {
                match log_event(&data) {
                    LogEvent::Line(line) => lines.push(line),
                    LogEvent::Skipped(n) => {
                        eprintln!("hangard: {n} log lines skipped (this reader fell behind)");
                    }
                }
            }
            if !print_lines(lines)? {
                break;
            }
        }
        Ok(ExitCode::SUCCESS)
    })?
}

/// Writes `lines` to stdout and flushes. `false` when stdout is closed
/// (`hangard logs -f chat | head`): the command then ends quietly.
fn print_lines(lines: impl IntoIterator<Item = String>) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    let written =
        lines.into_iter().try_for_each(|line| writeln!(out, "{line}")).and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

/// One log line as printed: `<timestamp> [<replica>] <stream>: <line>`.
fn log_line(line: &Value) -> String {
    let text = |key: &str| match &line[key] {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    };
    format!("{} [{}] {}: {}", text("timestamp"), text("replica"), text("stream"), text("line"))
}

/// What one event of the followed log says.
#[derive(Debug, PartialEq, Eq)]
enum LogEvent {
    /// A line, formatted for printing.
    Line(String),
    /// The server dropped this many lines because the reader was too slow.
    Skipped(u64),
}

/// Reads an event's data: a log line, or a `skipped_lines` notice. Data that is not a JSON
/// object is printed as it came rather than lost.
fn log_event(data: &str) -> LogEvent {
    match serde_json::from_str::<Value>(data) {
        Ok(value @ Value::Object(_)) => match value["skipped_lines"].as_u64() {
            Some(n) => LogEvent::Skipped(n),
            None => LogEvent::Line(log_line(&value)),
        },
        _ => LogEvent::Line(data.to_owned()),
    }
}

/// Splits a server-sent event stream, fed in arbitrary chunks, into each event's data.
///
/// Bytes are cut into lines before they are decoded, so a chunk boundary inside a UTF-8
/// character, a line or an event is no problem. Lines end in `\n`, `\r\n` or `\r`; a blank
/// line ends an event; its `data:` lines are joined with `\n`; comments, other fields and
/// events without data are skipped.
#[derive(Debug, Default)]
struct SseEvents {
    /// Bytes of the line not yet ended.
    pending: Vec<u8>,
    /// The event being read: its data lines so far.
    data: Option<String>,
    /// The last byte seen was a `\r`, so a `\n` right after it ends nothing more.
    after_cr: bool,
}

impl SseEvents {
    /// Feeds `chunk`; returns the data of every event it completed, in order.
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.pending);
                    if let Some(data) = self.line(&String::from_utf8_lossy(&line)) {
                        events.push(data);
                    }
                }
                _ => self.pending.push(byte),
            }
        }
        events
    }

    /// Takes one whole line; returns the event's data when the line ends one.
    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        None
    }
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
    /// Reads the error envelope `{"error": {"code", "message"}}`, or whatever came.
    fn from_body(status: reqwest::StatusCode, bytes: &[u8]) -> Self {
        let value: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let error = &value["error"];
        let code = error["code"].as_str().unwrap_or("http_error").to_owned();
        let message = match error {
            Value::Object(e) => e.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
            Value::String(s) => s.clone(),
            _ => String::from_utf8_lossy(bytes).into_owned(),
        };
        Self { status, code, message }
    }

    fn report(&self) -> ExitCode {
        eprintln!("error: {} ({}): {}", self.code, self.status, self.message);
        ExitCode::FAILURE
    }
}

impl Remote {
    /// Sends one request and reads its JSON answer. `Err` only when the server cannot be
    /// reached or the answer cannot be read; an error answer is `Ok(Err(Failure))`.
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<Value, Failure>> {
        let response = match self.send(method, path, body).await? {
            Ok(response) => response,
            Err(failure) => return Ok(Err(failure)),
        };
        let url = response.url().clone();
        let bytes = response.bytes().await.with_context(|| format!("reading {url}"))?;
        Ok(Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    /// Sends one request; a 2xx answer comes back unread (its body may be a stream), an
    /// error answer as `Ok(Err(Failure))`.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<reqwest::Response, Failure>> {
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
        if status.is_success() {
            return Ok(Ok(response));
        }
        let bytes = response.bytes().await.with_context(|| format!("{method} {url}"))?;
        Ok(Err(Failure::from_body(status, &bytes)))
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

    /// Feeds `stream` cut at `cuts` and collects every event's data.
    fn split(stream: &[u8], cuts: &[usize]) -> Vec<String> {
        let mut events = SseEvents::default();
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain([stream.len()].iter()) {
            out.extend(events.push(&stream[start..cut]));
            start = cut;
        }
        out
    }

    #[test]
    fn sse_events_are_the_same_wherever_the_chunks_are_cut() {
        let stream = "data: {\"line\":\"é→✓\"}\n\ndata: {\"skipped_lines\": 3}\n\n".as_bytes();
        let whole = split(stream, &[]);
        assert_eq!(whole, [r#"{"line":"é→✓"}"#, r#"{"skipped_lines": 3}"#]);
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                assert_eq!(split(stream, &[a, b]), whole, "cut at {a} and {b}");
            }
        }
        let bytes: Vec<usize> = (0..=stream.len()).collect();
        assert_eq!(split(stream, &bytes), whole, "one byte at a time");
    }

    #[test]
    fn sse_events_end_at_a_blank_line_in_any_line_ending() {
        let cases: [(&str, &[&str]); 8] = [
            ("data: a\n\n", &["a"]),
            ("data: a\r\n\r\ndata: b\r\n\r\n", &["a", "b"]),
            ("data: a\r\rdata: b\n\n", &["a", "b"]),
            ("data: a\ndata: b\n\n", &["a\nb"]),
            ("data:a\n\ndata:  b\n\n", &["a", " b"]),
            (": keep-alive\n\nevent: x\nid: 1\n\ndata: a\n\n", &["a"]),
            ("data: a\n", &[]),
            ("data: a\n\n\n\ndata\n\n", &["a", ""]),
        ];
        for (stream, expected) in cases {
            assert_eq!(split(stream.as_bytes(), &[]), expected, "{stream:?}");
        }
    }

    #[test]
    fn a_partial_event_waits_for_its_blank_line() {
        let mut events = SseEvents::default();
        assert!(events.push(b"data: {\"li").is_empty());
        assert!(events.push(b"ne\": 1}\n").is_empty());
        assert_eq!(events.push(b"\ndata: x"), [r#"{"line": 1}"#]);
        assert_eq!(events.push(b"\r\n\r\n"), ["x"]);
    }

    #[test]
    fn log_lines_print_as_timestamp_replica_stream_text() {
        let line = json!({"timestamp": "2026-11-23T00:43:44.686Z", "replica": 1,
                          "stream": "stderr", "line": "main: server is listening"});
        let printed = "2026-11-23T00:43:44.686Z [1] stderr: main: server is listening";
        assert_eq!(log_line(&line), printed);
        assert_eq!(log_event(&line.to_string()), LogEvent::Line(printed.into()));
        assert_eq!(log_event(r#"{"skipped_lines": 12}"#), LogEvent::Skipped(12));
        assert_eq!(log_line(&json!({"line": ""})), "? [?] ?: ");
        assert_eq!(log_event("not json"), LogEvent::Line("not json".into()));
        assert_eq!(log_event("42"), LogEvent::Line("42".into()));
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
