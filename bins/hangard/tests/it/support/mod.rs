//! Starts the real `hangard serve` on an OS-assigned loopback port, from a config written to
//! a fresh temporary directory, and stops it. Shared by the integration tests and the
//! server benchmark.
#![allow(dead_code)]

pub(crate) mod engines;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The line `hangard serve` prints once its listener is bound.
pub(crate) const LISTENING: &str = "hangard listening on ";

/// A running `hangard serve`. Killed (and its config directory removed) on drop; its log
/// is printed when the test fails.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    logs: Arc<Mutex<String>>,
    dir: PathBuf,
    status: Option<ExitStatus>,
}

/// A fresh, empty directory under the system temp dir.
pub(crate) fn temp_dir(label: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "hangard-{label}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The environment variables `hangard` reads; removed so the host cannot leak into a test.
pub(crate) const HANGARD_ENV: [&str; 8] = [
    "HANGAR_CONFIG",
    "HANGAR_ADMIN_KEY",
    "HANGAR_URL",
    "RUST_LOG",
    "HANGAR_CTX_SIZE",
    "HANGAR_LLAMACPP_ARGS",
    "HANGAR_LLAMACPP",
    "HANGAR_NVML_LIBRARY",
];

/// A `hangard` command with a clean environment.
pub(crate) fn hangard() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangard"));
    for var in HANGARD_ENV {
        cmd.env_remove(var);
    }
    // No gRPC listener unless a test asks for one: parallel servers would share port 8001.
    cmd.env("HANGAR_GRPC_PORT", "0");
    cmd
}

impl Server {
    /// Writes `settings` as `settings.json` to a new directory and serves it on port 0
    /// with `args` added.
    pub(crate) fn start(settings: &Value, args: &[&str]) -> Self {
        Self::start_with(settings, args, &[])
    }

    /// As [`Server::start`], with extra environment variables.
    pub(crate) fn start_with(settings: &Value, args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = temp_dir("serve");
        std::fs::write(dir.join("settings.json"), serde_json::to_vec_pretty(settings).unwrap())
            .unwrap();
        Self::spawn(dir, args, env)
    }

    fn spawn(dir: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = hangard();
        cmd.args(["serve", "--config"]).arg(&dir).args(["--port", "0"]).args(args);
        cmd.envs(env.iter().copied()).env("RUST_LOG", "info");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("hangard starts");
        let logs = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn({
            let logs = Arc::clone(&logs);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut logs = logs.lock().unwrap();
                    logs.push_str(&line);
                    logs.push('\n');
                }
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let base = loop {
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let status = child.wait().unwrap();
                std::thread::sleep(Duration::from_millis(50)); // let the log thread finish
                panic!("hangard exited ({status}) before listening:\n{}", logs.lock().unwrap());
            }
            if let Some(url) = line.trim_end().strip_prefix(LISTENING) {
                break url.to_owned();
            }
        };
        // Keep draining stdout so the server never blocks or fails on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        Self { child, base, logs, dir, status: None }
    }

    /// `base` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The config directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server logged so far.
    pub(crate) fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// Sends SIGTERM, as a service manager does.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit, at most `limit`.
    pub(crate) fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.status = Some(status);
                return status;
            }
            assert!(Instant::now() < deadline, "hangard did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- hangard log ({}) ---\n{}", self.base, self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------
// Server-sent events

/// One server-sent event.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// The `event:` field, when there is one (the Responses API names its events).
    pub(crate) name: Option<String>,
    /// The `data:` lines, joined.
    pub(crate) data: String,
}

impl Event {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {}", self.data))
    }
}

/// A streaming response read event by event. Bytes are split into events before they are
/// decoded, so a UTF-8 character split across network reads is no problem.
pub(crate) struct Sse {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Sse {
    /// POSTs `body` to `path`; the answer must be a 200 event stream.
    pub(crate) async fn start(server: &Server, path: &str, body: &Value) -> Self {
        let response =
            reqwest::Client::new().post(server.url(path)).json(body).send().await.unwrap();
        let status = response.status();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            panic!("streaming {path} answered {status}: {text}");
        }
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        Self { response, buffer: Vec::new() }
    }

    /// Reads `response` (already checked) as an event stream.
    pub(crate) fn from_response(response: reqwest::Response) -> Self {
        Self { response, buffer: Vec::new() }
    }

    /// The next event with data; `None` at the end of the body.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let raw = String::from_utf8(raw).expect("events are UTF-8");
                let mut name = None;
                let mut data = Vec::new();
                for line in raw.lines() {
                    if let Some(value) = line.strip_prefix("data:") {
                        data.push(value.strip_prefix(' ').unwrap_or(value));
                    } else if let Some(value) = line.strip_prefix("event:") {
                        name = Some(value.trim().to_owned());
                    }
                }
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Some(Event { name, data: data.join("\n") });
            }
            let chunk = self.response.chunk().await.expect("the stream reads")?;
            self.buffer.extend_from_slice(&chunk);
        }
    }

    /// Every remaining event.
    pub(crate) async fn all(mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        assert!(self.buffer.iter().all(u8::is_ascii_whitespace), "a partial event at the end");
        events
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

/// A request with an optional JSON body and bearer key: `(status, JSON body)`, a body that
/// is not JSON as a string. Error statuses are returned, not raised.
pub(crate) async fn send(
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    key: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// `GET` of `path` on `server`.
pub(crate) async fn get(server: &Server, path: &str) -> (u16, Value) {
    send(reqwest::Method::GET, &server.url(path), None, None).await
}

/// `POST` of `body` to `path` on `server`.
pub(crate) async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    send(reqwest::Method::POST, &server.url(path), Some(&body), None).await
}

/// Loads `model` through the admin API with the load `body`.
pub(crate) async fn load(server: &Server, model: &str, body: Value) -> (u16, Value) {
    post(server, &format!("/v1/admin/models/{model}/load"), body).await
}

/// Unloads `model` through the admin API.
pub(crate) async fn unload(server: &Server, model: &str) -> (u16, Value) {
    post(server, &format!("/v1/admin/models/{model}/unload"), Value::Object(Default::default()))
        .await
}

/// The model's admin row (must answer 200).
pub(crate) async fn row(server: &Server, model: &str) -> Value {
    let (status, row) = get(server, &format!("/v1/admin/models/{model}")).await;
    assert_eq!(status, 200, "{row}");
    row
}

/// Polls the model's admin row until `done` holds, failing after 30 s; the row that held.
pub(crate) async fn wait_for_row(
    server: &Server,
    model: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = row(server, model).await;
        if done(&row) {
            return row;
        }
        assert!(Instant::now() < deadline, "{model} never got {what}: {row}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `error.code` of an error body.
pub(crate) fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("no error code in {body}"))
}

/// `model` (a JSON object) with the fields of `extra` set.
pub(crate) fn with(mut model: Value, extra: Value) -> Value {
    for (key, value) in extra.as_object().expect("an object") {
        model[key] = value.clone();
    }
    model
}

// ---------------------------------------------------------------------------------------
// Processes

/// `(state, ppid, comm)` of a process, from `/proc/<pid>/stat`; `None` when it is gone.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid, comm))
}

/// Whether `pid` runs (a zombie waiting for a parent that does not reap it does not).
pub(crate) fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _, _)| state != 'Z')
}

/// Polls until `pid` no longer runs, failing after `limit`.
pub(crate) async fn wait_gone(pid: u32, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still runs after {limit:?}: {:?}",
            proc_stat(pid)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
