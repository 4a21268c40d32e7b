//! The supervisor and the forwarding client against a faithful fake of `vllm serve`
//! (`tests/fake-vllm/vllm`, Python, stdlib only): exact argv and environment, readiness,
//! a load timeout, a crash at start, a crash while loaded (with in-flight requests), stop
//! with SIGTERM then SIGKILL, and upstream cancellation when a client goes away.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hangar_backend::{
    Backend, CrashSink, ForwardRequest, ForwardResponse, ForwardRoute, LoadError, LoadRequest,
    LogStream, ModelLogs, Runtime, RuntimeError, ThinkingMode,
};
use hangar_backend_process::ProcessBackend;
use hangar_config::ModelConfig;
use serde_json::{Value, json};

use crate::support::model;

/// What a load reported: the model's log and the crash reasons.
struct Watch {
    logs: ModelLogs,
    crashes: Arc<Mutex<Vec<String>>>,
}

impl Watch {
    fn text(&self) -> String {
        self.logs.tail(usize::MAX).into_iter().map(|l| l.line + "\n").collect()
    }

    /// The value after `prefix` on the first log line that starts with it.
    fn line_after(&self, prefix: &str) -> Option<String> {
        self.logs
            .tail(usize::MAX)
            .into_iter()
            .find_map(|l| l.line.strip_prefix(prefix).map(str::to_owned))
    }

    /// Waits until `done(log text)` holds.
    async fn until(&self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&self.text()) {
            assert!(Instant::now() < deadline, "no {what} in the log:\n{}", self.text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn backend() -> ProcessBackend {
    ProcessBackend::vllm_serve().with_stop_grace(Duration::from_millis(500))
}

async fn load(model: Arc<ModelConfig>) -> (Result<Arc<dyn Runtime>, LoadError>, Watch) {
    let watch = Watch { logs: ModelLogs::default(), crashes: Arc::default() };
    let crashes = Arc::clone(&watch.crashes);
    let mut request = LoadRequest::new(model, 0, 1);
    request.logs = watch.logs.clone();
    request.crash = CrashSink::new(move |reason| crashes.lock().unwrap().push(reason));
    (backend().load(request).await, watch)
}

fn chat(content: &str, stream: bool) -> ForwardRequest {
    let body = json!({
        "model": "fake", "stream": stream, "max_tokens": 4,
        "messages": [{ "role": "user", "content": content }],
    });
    ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from(body.to_string()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: hangar_config::DEFAULT_MAX_ANSWER_BYTES,
    }
}

async fn read_all(mut answer: ForwardResponse) -> Result<String, RuntimeError> {
    let mut text = Vec::new();
    while let Some(chunk) = answer.body.recv().await {
        text.extend_from_slice(&chunk?);
    }
    Ok(String::from_utf8(text).unwrap())
}

fn pid_alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

async fn until_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} is still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_child_gets_the_exact_argv_and_environment_and_serves_forwarded_requests() {
    let (runtime, watch) = load(model(json!({
        "vllm_max_model_len": 4096,
        "vllm_kv_cache_memory_bytes": 1048576,
        "vllm_library_path": "/opt/fake-lib",
        "vllm_env": { "FAKE_VLLM_ECHO_ENV": "HF_HOME,LD_LIBRARY_PATH,VLLM_API_KEY", "HF_HOME": "/hf" },
        "vllm_api_key": "k",
    })))
    .await;
    let runtime = runtime.expect("the fake loads");
    let argv: Vec<String> =
        serde_json::from_str(&watch.line_after("FAKE_VLLM_ARGV ").expect("argv line")).unwrap();
    // On a Unix socket in a directory only this user can enter: vLLM's key guards only its
    // `/v1` routes, and no other local user reaches the rest.
    let socket = runtime.details()["socket"].as_str().expect("a socket").to_owned();
    let dir = std::path::Path::new(&socket).parent().unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);
    let expected = [
        "serve",
        "Qwen/Qwen3-0.6B",
        &format!("--uds={socket}"),
        "--served-model-name=fake",
        "--max-model-len=4096",
        "--kv-cache-memory-bytes=1048576",
    ];
    assert_eq!(argv, expected);
    let env: Value = serde_json::from_str(&watch.line_after("FAKE_VLLM_ENV ").unwrap()).unwrap();
    assert_eq!(env["HF_HOME"], "/hf");
    assert!(env["LD_LIBRARY_PATH"].as_str().unwrap().starts_with("/opt/fake-lib"), "{env}");
    assert_eq!(env["VLLM_API_KEY"], "k");

    let whole = read_all(runtime.forward(chat("hello there", false)).await.unwrap()).await.unwrap();
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["usage"]["completion_tokens"], 4, "{whole}");
    let streamed = runtime.forward(chat("hello", true)).await.unwrap();
    assert!(streamed.content_type.as_deref().unwrap().starts_with("text/event-stream"));
    let text = read_all(streamed).await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    let thinking = ForwardRequest { thinking: ThinkingMode::Disabled, ..chat("hi", false) };
    let answer: Value =
        serde_json::from_str(&read_all(runtime.forward(thinking).await.unwrap()).await.unwrap())
            .unwrap();
    assert_eq!(answer["fake_chat_template_kwargs"], json!({ "enable_thinking": false }));

    let wrong = ForwardRequest {
        body: Bytes::from(r#"{"model":"other","messages":[]}"#),
        ..chat("", false)
    };
    let Err(RuntimeError::InvalidRequest { message }) = runtime.forward(wrong).await else {
        panic!()
    };
    assert!(message.contains("does not exist"), "{message}");

    let pid = runtime.details()["pid"].as_i64().unwrap() as i32;
    runtime.unload().await;
    assert!(!pid_alive(pid), "unload returns after the child is gone");
    assert!(watch.crashes.lock().unwrap().is_empty(), "an unload is not a crash");
    assert!(watch.text().contains("Shutting down"), "SIGTERM first:\n{}", watch.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_never_listens_fails_at_load_timeout_and_is_stopped() {
    let started = Instant::now();
    let (runtime, watch) = load(model(json!({
        "load_timeout_s": 1,
        "vllm_env": { "FAKE_VLLM_NEVER_READY": "1" },
    })))
    .await;
    let Err(LoadError::Failed { message }) = runtime else { panic!("loaded?") };
    assert!(message.contains("not ready after 1 s"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: i32 =
        watch.line_after("started pid ").unwrap().split(':').next().unwrap().parse().unwrap();
    until_gone(pid).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_crashes_at_start_fails_the_load_with_its_last_lines() {
    let (runtime, _watch) =
        load(model(json!({ "vllm_env": { "FAKE_VLLM_CRASH_AT_START": "1" } }))).await;
    let Err(LoadError::Failed { message }) = runtime else { panic!("loaded?") };
    assert!(message.contains("exited with status 3"), "{message}");
    assert!(message.contains("CUDA out of memory (fake)"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_port_taken_before_the_child_binds_it_is_replaced_but_a_configured_one_is_not() {
    let dir = std::env::temp_dir().join(format!("hangar-lose-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("times");
    // On a port Hangar picks (a host named: not on its private socket).
    let lose = json!({ "FAKE_VLLM_LOSE_PORT_FILE": file.to_str().unwrap() });
    let env = json!({ "vllm_host": "127.0.0.1", "vllm_env": lose });

    // Lost once: started again on another port, and the log says why.
    std::fs::write(&file, "1").unwrap();
    let (runtime, watch) = load(model(env.clone())).await;
    let runtime = runtime.expect("loaded on the second port");
    let hangar: Vec<String> = watch
        .logs
        .tail(100)
        .into_iter()
        .filter(|l| l.line.contains("was taken"))
        .map(|l| l.line)
        .collect();
    assert_eq!(hangar.len(), 1, "{hangar:?}");
    assert_eq!(
        read_all(runtime.forward(chat("hi", false)).await.unwrap()).await.map(|t| t.is_empty()),
        Ok(false)
    );
    runtime.unload().await;

    // Lost every time: three starts, then the engine's own words.
    std::fs::write(&file, "9").unwrap();
    let (runtime, _) = load(model(env.clone())).await;
    let Err(LoadError::Failed { message }) = runtime else { panic!("loaded?") };
    assert!(message.contains("address already in use"), "{message}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "6", "three starts");

    // A configured port is the operator's: no second start.
    let mut configured = env.clone();
    configured["vllm_port"] = json!(free_port());
    let (runtime, _) = load(model(configured)).await;
    assert!(runtime.is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "5", "one start");
    let _ = std::fs::remove_dir_all(&dir);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_while_loaded_is_reported_and_fails_inflight_requests() {
    let (runtime, watch) = load(model(
        json!({ "vllm_env": { "FAKE_VLLM_TOKEN_DELAY_MS": "200", "FAKE_VLLM_TOKENS": "50" } }),
    ))
    .await;
    let runtime = runtime.unwrap();
    let mut slow = runtime.forward(chat("long answer", true)).await.unwrap();
    slow.body.recv().await.expect("a first chunk").unwrap();
    let crash = runtime.forward(chat("please crash", false)).await;
    let Err(RuntimeError::Crashed { reason }) = crash else { panic!("{crash:?}") };
    assert!(reason.contains("exited with status 9"), "{reason}");
    let mut last = None;
    while let Some(chunk) = slow.body.recv().await {
        last = Some(chunk);
    }
    assert!(matches!(last, Some(Err(RuntimeError::Crashed { .. }))), "{last:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while watch.crashes.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no crash report");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(watch.crashes.lock().unwrap()[0].contains("exited with status 9"));
    assert!(matches!(runtime.health().await, Err(RuntimeError::Crashed { .. })));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_ignores_sigterm_gets_sigkill_after_the_grace_period() {
    let (runtime, watch) =
        load(model(json!({ "vllm_env": { "FAKE_VLLM_IGNORE_SIGTERM": "1" } }))).await;
    let runtime = runtime.unwrap();
    let pid = runtime.details()["pid"].as_i64().unwrap() as i32;
    let started = Instant::now();
    runtime.unload().await;
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(!pid_alive(pid));
    let text = watch.text();
    assert!(text.contains("ignored SIGTERM") && text.contains("signal 9"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let (runtime, watch) = load(model(
        json!({ "vllm_env": { "FAKE_VLLM_TOKEN_DELAY_MS": "100", "FAKE_VLLM_TOKENS": "100" } }),
    ))
    .await;
    let runtime = runtime.unwrap();
    let mut answer = runtime.forward(chat("go on", true)).await.unwrap();
    answer.body.recv().await.unwrap().unwrap();
    drop(answer);
    watch.until("cancellation", |log| log.contains("FAKE_VLLM_CANCELLED")).await;
    let stderr = watch.logs.tail(usize::MAX).iter().any(|l| l.stream == LogStream::Stderr);
    assert!(stderr, "stderr lines are captured too");
    runtime.unload().await;
}

/// Lemonade #2554: a model that loads on the port an unloaded (or evicted) model just freed
/// starts cleanly, round after round: an unload returns only once the old child is gone and
/// its port free, so the next child binds it and answers itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_loaded_on_the_port_another_just_freed_starts_cleanly() {
    let port = free_port();
    let on_port = |name: &str| {
        let value = Value::Object(model(json!({ "vllm_port": port })).raw().clone());
        let name = hangar_config::ModelName::new(name).unwrap();
        Arc::new(ModelConfig::parse(&name, &value).unwrap())
    };
    for round in 0..3 {
        let (old, _) = load(on_port("evicted")).await;
        let old = old.expect("the first model loaded");
        let pid = i32::try_from(old.pid().expect("a child")).unwrap();
        old.unload().await;
        assert!(!pid_alive(pid), "round {round}: the old child outlived its unload");
        // `fake`: the name the chat request asks for; the old child would not know it.
        let (new, watch) = load(on_port("fake")).await;
        let new = new.unwrap_or_else(|e| panic!("round {round}: {e}\n{}", watch.text()));
        let answer = read_all(new.forward(chat("hi", false)).await.unwrap()).await.unwrap();
        assert!(answer.contains(r#""model": "fake""#), "round {round}: {answer}");
        new.unload().await;
    }
}
