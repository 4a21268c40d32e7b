//! Children that fail: killed with SIGKILL, never ready, crashing at start; and hangard
//! killed with SIGKILL leaves no child behind.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_child_fails_the_model_and_every_inflight_request() {
    // 8,192 cells: each of the four slots holds a prompt and 1,500 generated tokens.
    let models = json!({ "chat": chat_model(json!({ "llama_server_n_ctx": 8192 })) });
    let server = Server::start(&config(models), &[]);
    let pid = load_ok(&server, "chat", json!({})).await;

    // 1,500 tokens take more than a second on this model (about 1.6 s alone on 2 cores).
    const LONG: u32 = 1500;
    let whole = tokio::spawn({
        let url = server.url("/v1/chat/completions");
        async move { send(Method::POST, &url, Some(&chat_body("chat", LONG)), None).await }
    });
    let mut request = chat_body("chat", LONG);
    request["stream"] = true.into();
    let mut stream = Sse::start(&server, "/v1/chat/completions", &request).await;
    loop {
        let chunk = stream.next().await.expect("the stream runs").json();
        assert!(chunk.get("error").is_none(), "{chunk}");
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            break;
        }
    }
    wait_for_row(&server, "chat", "both requests running", |r| r["runtime_inflight"] == 2).await;
    assert!(!whole.is_finished(), "the non-streamed chat ended before the kill: make it longer");

    kill9(pid);

    // The stream ends with the crash, then [DONE].
    let mut rest = Vec::new();
    while let Some(event) = stream.next().await {
        rest.push(event);
    }
    let (done, rest) = rest.split_last().expect("events after the kill");
    assert_eq!(done.data, "[DONE]", "{rest:?}");
    let (error, chunks) = rest.split_last().expect("an error event");
    let error = error.json();
    assert_eq!(code(&error), "backend_crashed", "{error}");
    assert!(message(&error).contains("signal 9"), "{error}");
    for chunk in chunks {
        assert!(chunk.json().get("error").is_none(), "one error event, the last: {chunk:?}");
    }

    // The whole answer: 500 backend_crashed.
    let (status, body) = whole.await.unwrap();
    assert_eq!((status, code(&body)), (500, "backend_crashed"), "{body}");

    // The model is failed, with the signal in last_error.
    let failed = wait_for_row(&server, "chat", "failed", |r| r["runtime_state"] == "failed").await;
    let last_error = failed["last_error"].as_str().unwrap_or_else(|| panic!("{failed}"));
    assert!(last_error.contains("backend crashed"), "{last_error}");
    assert!(last_error.contains("signal 9"), "{last_error}");
    assert_eq!(failed["runtime_details"], json!([]), "{failed}");
    let (status, refused) = post(&server, "/v1/chat/completions", chat_body("chat", 4)).await;
    assert_eq!((status, code(&refused)), (503, "model_failed"), "{refused}");

    // A new load recovers.
    let again = load_ok(&server, "chat", json!({})).await;
    assert_ne!(again, pid);
    chat_ok(&server, "chat", 4).await;
}

/// `llama-server` queues requests itself: with `target_inflight` 1 (`--parallel 1`) Hangar
/// hands the child two more requests (`dispatch_ahead`), so it never idles between two, and
/// keeps the rest in its own queue, where the admin row counts them.

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_never_becomes_ready_fails_at_load_timeout() {
    let server = Server::start(&config(json!({ "stuck": never_ready_model(2) })), &[]);
    let started = Instant::now();
    let (status, body) = load(&server, "stuck", json!({})).await;
    let took = started.elapsed();
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(took >= Duration::from_secs(2), "it waited load_timeout_s: {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let text = message(&body);
    assert!(text.contains("not ready after 2 s"), "{text}");
    assert!(text.contains("loading forever"), "the child's output: {text}");
    let shown = row(&server, "stuck").await;
    assert_eq!(shown["runtime_state"], "failed", "{shown}");
    assert!(shown["last_error"].as_str().unwrap().contains("not ready after 2 s"), "{shown}");

    let (pid, _) = last_start(&log_lines(&server, "stuck").await).expect("a start");
    wait_gone(pid, Duration::from_secs(5), "the never-ready script").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_crashes_at_start_fails_with_its_last_lines() {
    // The tiny GGUF with an architecture llama.cpp does not know: Hangar's check of the file
    // (header, tensors inside it) passes, llama-server starts and fails on it.
    let garbage = temp_dir("garbage").join("x.gguf");
    let mut bytes = std::fs::read(crate::support::engines::fixture("tiny-llama.gguf")).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the key") + key.len();
    // After the key: its type (u32) and the string's length (u64), then `llama`.
    assert_eq!(&bytes[at + 12..at + 17], b"llama");
    bytes[at + 12..at + 17].copy_from_slice(b"xxxxx");
    std::fs::write(&garbage, bytes).unwrap();
    let model = llama_server("tiny-llama.gguf", json!({ "model_path": garbage.to_str().unwrap() }));
    let server = Server::start(&config(json!({ "broken": model })), &[]);
    let (status, body) = load(&server, "broken", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("failed to load model"), "{body}");
    let shown = row(&server, "broken").await;
    assert_eq!(shown["runtime_state"], "failed", "{shown}");
    let last_error = shown["last_error"].as_str().unwrap_or_else(|| panic!("{shown}"));
    assert!(last_error.contains("exited"), "{last_error}");
    // llama-server's own words.
    assert!(last_error.contains("failed to load model"), "{last_error}");
    assert!(last_error.contains("x.gguf"), "{last_error}");
    let _ = std::fs::remove_dir_all(garbage.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_hangard_leaves_no_child_alive() {
    // A loaded child.
    let mut server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let pid = load_ok(&server, "chat", json!({})).await;
    assert!(alive(pid));
    kill9(server.pid());
    server.wait(Duration::from_secs(10));
    wait_gone(pid, Duration::from_secs(10), "llama-server after hangard's SIGKILL").await;

    // A child still loading.
    let mut server = Server::start(&config(json!({ "stuck": never_ready_model(60) })), &[]);
    let loading = tokio::spawn({
        let url = server.url("/v1/admin/models/stuck/load");
        async move { reqwest::Client::new().post(url).json(&json!({})).send().await.map(|r| r.status()) }
    });
    let (pid, _) = wait_for_start(&server, "stuck").await;
    assert!(alive(pid));
    let shown = row(&server, "stuck").await;
    assert_eq!(shown["runtime_state"], "loading", "{shown}");
    kill9(server.pid());
    server.wait(Duration::from_secs(10));
    wait_gone(pid, Duration::from_secs(10), "the loading child after hangard's SIGKILL").await;
    let answer = loading.await.unwrap();
    assert!(answer.is_err(), "the load cannot answer: {answer:?}");
}
