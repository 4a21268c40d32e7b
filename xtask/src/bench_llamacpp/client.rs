//! The client side of the llama.cpp benchmarks, shared by `bench proxy` and `bench
//! streams`: a started server, the one HTTP client configuration, and timed non-streamed
//! and streamed completions.

use super::*;

/// A running server. Killed on drop.
pub(crate) struct Server {
    /// `hangar` or `llama-server`, for messages.
    pub(crate) name: &'static str,
    /// The server process.
    pub(crate) child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(super) base: String,
    /// The HTTP client for this server.
    pub(crate) agent: ureq::Agent,
    /// The file its output goes to.
    pub(crate) log: PathBuf,
    /// Spawn → model ready.
    pub(super) ready: Duration,
    /// The load request alone (Hangar only).
    pub(super) load: Duration,
}

impl Server {
    /// A started server, not yet timed.
    pub(crate) fn new(name: &'static str, child: Child, base: String, log: PathBuf) -> Self {
        let agent = client();
        Self { name, child, base, agent, log, ready: Duration::ZERO, load: Duration::ZERO }
    }

    /// `base` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Spawn → model ready, as timed at its start.
    pub(crate) fn ready(&self) -> Duration {
        self.ready
    }
}

/// The HTTP client both servers are measured with: error statuses are answers (the caller
/// checks them and shows the body), no redirects, reads time out after [`IO_TIMEOUT`], and
/// no idle connection is kept: every request connects anew, as every measure has since the
/// first version of this benchmark. (With pooled keep-alive connections a run once failed
/// with `Peer disconnected`: a request went out on a connection the server was closing.)
pub(crate) fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(0)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .build()
        .new_agent()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `settings` as `<work>/<name>/settings.json`; returns that config directory.
pub(crate) fn write_settings(work: &Path, name: &str, settings: &Value) -> Result<PathBuf> {
    let dir = work.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("settings.json");
    std::fs::write(&path, format!("{settings:#}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(dir)
}

/// The config directory of the bench: one CPU-only `llama_cpp` model, nothing loaded at start.
pub(super) fn write_config(work: &Path, model: &Path) -> Result<PathBuf> {
    let settings = json!({
        "host": "127.0.0.1",
        "auto_load": false,
        "max_loaded_models": {"llm": 1},
        "models": {
            MODEL: {
                "backend": "llama_cpp",
                "enabled": false,
                "model_path": model,
                "prompt_format": "auto",
                "gguf_n_ctx": N_CTX,
                "gguf_n_gpu_layers": 0,
                "gguf_n_threads": THREADS,
            }
        }
    });
    write_settings(work, "config", &settings)
}

/// One non-streaming chat completion.
pub(crate) struct Completion {
    pub(crate) elapsed: Duration,
    pub(crate) prompt_tokens: u64,
    pub(super) completion_tokens: u32,
    pub(super) finish_reason: String,
    pub(super) text: String,
    /// `llama-server`'s own generation time (`timings.predicted_ms`); 0 for Hangar.
    pub(super) server_predicted_ms: f64,
}

/// One streaming chat completion.
pub(crate) struct Streamed {
    /// Request sent → last event read.
    pub(crate) elapsed: Duration,
    /// Request sent → first chunk with text.
    pub(crate) first: Duration,
    /// `usage.completion_tokens` of the final chunk.
    pub(crate) completion_tokens: u32,
}

/// `POST /v1/chat/completions` and its usage.
pub(crate) fn complete(server: &Server, body: &Value) -> Result<Completion> {
    let started = Instant::now();
    let mut response = server
        .agent
        .post(server.url("/v1/chat/completions"))
        .send_json(body)
        .with_context(|| format!("{}: chat completion", server.name))?;
    let text = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("{}: chat completion body", server.name))?;
    let elapsed = started.elapsed();
    let status = response.status();
    if status != 200 {
        bail!("{}: chat completion answered {status}: {text}", server.name);
    }
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: chat completion is not JSON: {text}", server.name))?;
    let completion_tokens = v
        .pointer("/usage/completion_tokens")
        .and_then(Value::as_u64)
        .with_context(|| format!("{}: no usage.completion_tokens in {text}", server.name))?;
    Ok(Completion {
        elapsed,
        prompt_tokens: v.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        completion_tokens: u32::try_from(completion_tokens)?,
        finish_reason: v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
        text: v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        server_predicted_ms: v
            .pointer("/timings/predicted_ms")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
    })
}

/// `POST /v1/chat/completions` with `"stream": true`, read event by event as it arrives.
pub(super) fn stream(server: &Server, body: &Value) -> Result<Streamed> {
    stream_with(&server.agent, server, body)
}

/// [`stream`] sent with `agent` (a client thread's own) instead of the server's.
pub(crate) fn stream_with(agent: &ureq::Agent, server: &Server, body: &Value) -> Result<Streamed> {
    let started = Instant::now();
    let mut response = agent
        .post(server.url("/v1/chat/completions"))
        .send_json(body)
        .with_context(|| format!("{}: stream", server.name))?;
    let status = response.status();
    if status != 200 {
        let text = response.body_mut().read_to_string()?;
        bail!("{}: stream answered {status}: {text}", server.name);
    }
    let mut reader = BufReader::new(response.body_mut().as_reader());
    let mut first = None;
    let mut completion_tokens = None;
    let mut line = String::new();
    loop {
        line.clear();
        let read = reader.read_line(&mut line);
        if read.with_context(|| format!("{}: stream body", server.name))? == 0 {
            break;
        }
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)
            .with_context(|| format!("{}: event is not JSON: {data}", server.name))?;
        let text = v.pointer("/choices/0/delta/content").and_then(Value::as_str);
        if first.is_none() && text.is_some_and(|t| !t.is_empty()) {
            first = Some(started.elapsed());
        }
        if let Some(n) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            completion_tokens = Some(u32::try_from(n)?);
        }
    }
    let elapsed = started.elapsed();
    Ok(Streamed {
        elapsed,
        first: first.with_context(|| format!("{}: the stream had no text", server.name))?,
        completion_tokens: completion_tokens
            .with_context(|| format!("{}: the stream had no usage chunk", server.name))?,
    })
}
