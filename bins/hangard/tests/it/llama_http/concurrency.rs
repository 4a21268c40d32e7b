//! Replicas and cancellation: streams side by side, one batch, a client that hangs up.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

// 8-9. Replicas and cancellation

/// What a reader saw, in the order the test saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Content(usize),
    Finish(usize),
}

/// Starts a chat stream and reads it to its end, logging content and finish chunks as they
/// arrive. Reading starts as soon as this stream's headers do, so the log follows the
/// server's order (a reader that started late would find a finished stream's end in its
/// buffers and could log it after content the other stream sent later).
async fn read_logged(
    stream: usize,
    server: &Server,
    request: &Value,
    log: &Mutex<Vec<Seen>>,
) -> Vec<Event> {
    let mut sse = Sse::start(server, "/v1/chat/completions", request).await;
    let mut events = Vec::new();
    while let Some(event) = sse.next().await {
        if event.data != "[DONE]" {
            let chunk = event.json();
            let choice = &chunk["choices"][0];
            if choice["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
                log.lock().unwrap().push(Seen::Content(stream));
            }
            if choice["finish_reason"].is_string() {
                log.lock().unwrap().push(Seen::Finish(stream));
            }
        }
        events.push(event);
    }
    events
}

#[tokio::test]
async fn two_replicas_stream_two_chats_at_once() {
    let models = json!({ "duo": chat_model(json!({ "replicas": 2, "replica_max": 2 })) });
    let server = serve(models, &["duo"]).await;
    let shown = row(&server, "duo").await;
    assert_eq!(
        (shown["replicas"].as_u64(), shown["loaded_replicas"].as_u64()),
        (Some(2), Some(2)),
        "{shown}"
    );
    assert_eq!(shown["definition"]["replicas"], 2, "{shown}");
    // One sequence at a time per llama.cpp replica.
    assert_eq!(shown["effective_target_inflight"], 1, "{shown}");

    // Long greedy generations: several hundred milliseconds each.
    let prompt = running_prompt(&server, "duo", 600).await;
    let request = streaming(chat_body("duo", &prompt, 600), json!({}));
    let log = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let readers = async {
        let streams = tokio::join!(
            read_logged(0, &server, &request, &log),
            read_logged(1, &server, &request, &log)
        );
        done.store(true, Ordering::SeqCst);
        streams
    };
    // Meanwhile, the row counts both as running on the model's replicas.
    let monitor = async {
        let mut most = 0;
        while !done.load(Ordering::SeqCst) {
            let row = row(&server, "duo").await;
            most = most.max(row["runtime_inflight"].as_u64().unwrap());
            assert_eq!(row["queue_depth"], 0, "nothing waits with a free replica: {row}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    };
    let ((a, b), most_running) = tokio::join!(readers, monitor);

    let (a, b) = (streamed(&a, "chat.completion.chunk"), streamed(&b, "chat.completion.chunk"));
    assert_eq!(a.finish_reason.as_deref(), Some("length"));
    assert_eq!(b.finish_reason.as_deref(), Some("length"));
    assert_eq!(a.text, b.text, "same weights, same greedy text on both replicas");
    let log = log.into_inner().unwrap();
    let first_finish =
        log.iter().position(|s| matches!(s, Seen::Finish(_))).expect("a finish chunk");
    for stream in [0, 1] {
        assert!(
            log[..first_finish].contains(&Seen::Content(stream)),
            "stream {stream} got no content before the first stream finished: both must \
             progress at once (first finish at {first_finish} of {} events)",
            log.len()
        );
    }
    assert_eq!(most_running, 2, "both replicas were busy at the same time");
    wait_for_row(&server, "duo", "no work", |r| r["inflight_requests"] == 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_replica_streams_four_chats_at_once_in_one_batch() {
    let models = json!({ "batch": chat_model(json!({ "target_inflight": 4 })) });
    let server = serve(models, &["batch"]).await;
    let shown = row(&server, "batch").await;
    assert_eq!(shown["effective_target_inflight"], 4, "{shown}");
    // What llama.cpp was given: four sequences of the configured context, threads from the
    // machine's cores (no gguf_n_threads in the config).
    let details = &shown["runtime_details"];
    assert_eq!(details.as_array().map(Vec::len), Some(1), "one replica: {shown}");
    let details = &details[0];
    assert_eq!(
        (details["n_seq_max"].as_u64(), details["n_ctx_seq"].as_u64()),
        (Some(4), Some(2048))
    );
    assert_eq!(details["threads_from"], "core_share", "{details}");
    let cores = details["cores_available"].as_u64().expect("cores");
    let threads = details["n_threads"].as_u64().expect("threads");
    assert!((1..=cores).contains(&threads), "{details}");

    let prompt = running_prompt(&server, "batch", 600).await;
    let request = streaming(chat_body("batch", &prompt, 600), json!({}));
    let log = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let readers = async {
        let streams = tokio::join!(
            read_logged(0, &server, &request, &log),
            read_logged(1, &server, &request, &log),
            read_logged(2, &server, &request, &log),
            read_logged(3, &server, &request, &log)
        );
        done.store(true, Ordering::SeqCst);
        streams
    };
    let monitor = async {
        let mut most = 0;
        while !done.load(Ordering::SeqCst) {
            let row = row(&server, "batch").await;
            most = most.max(row["runtime_inflight"].as_u64().unwrap());
            assert_eq!(row["queue_depth"], 0, "nothing waits with a free sequence slot: {row}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    };
    let ((a, b, c, d), most_running) = tokio::join!(readers, monitor);
    let texts: Vec<String> = [a, b, c, d]
        .iter()
        .map(|events| {
            let s = streamed(events, "chat.completion.chunk");
            assert_eq!(s.finish_reason.as_deref(), Some("length"));
            s.text
        })
        .collect();
    // Same prompt, same greedy text — up to llama.cpp's arithmetic, which depends on the
    // batch's shape: a sequence that joins a step later (or reuses the cached prompt while
    // another recomputes it) is computed in a differently shaped batch, and 600 greedy tokens
    // from random weights can part on a near-tie late in the text (seen once in a clean-clone
    // CI run on a loaded machine). Cross-talk between sequences would show from the start.
    let shortest = texts.iter().map(String::len).min().unwrap_or(0);
    let common = |t: &String| t.bytes().zip(texts[0].bytes()).take_while(|(a, b)| a == b).count();
    assert!(
        texts.iter().all(|t| common(t) >= shortest / 4),
        "same prompt, same greedy text in one batch (at least its first quarter): {texts:#?}"
    );
    let log = log.into_inner().unwrap();
    let first_finish =
        log.iter().position(|s| matches!(s, Seen::Finish(_))).expect("a finish chunk");
    for stream in 0..4 {
        assert!(
            log[..first_finish].contains(&Seen::Content(stream)),
            "stream {stream} got no content before the first stream finished"
        );
    }
    assert_eq!(most_running, 4, "all four ran on the one replica at once");

    // The same prompt again reuses a slot's KV cells, and says so in its usage.
    let again = chat_ok(&server, "batch", &prompt, 4).await;
    let usage = &again["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt_tokens - 1));
    wait_for_row(&server, "batch", "no work", |r| r["inflight_requests"] == 0).await;
}

fn metric<'a>(metrics: &'a str, series: &str) -> Option<&'a str> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
}

#[tokio::test]
async fn a_client_that_disconnects_frees_the_replica() {
    let server = serve(json!({ "solo": chat_model(json!({})) }), &["solo"]).await;
    // A generation that runs for a while (at least 300 tokens, several hundred ms).
    let prompt = running_prompt(&server, "solo", 300).await;
    let request = streaming(chat_body("solo", &prompt, 2000), json!({}));
    let mut sse = Sse::start(&server, "/v1/chat/completions", &request).await;
    loop {
        let event = sse.next().await.expect("content before the end");
        let chunk = event.json();
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            break;
        }
    }
    drop(sse);

    // The only replica serves the next request (it waits its turn if it has to).
    chat_ok(&server, "solo", "hello", 4).await;
    wait_for_row(&server, "solo", "no work", |r| {
        (r["inflight_requests"].as_u64(), r["runtime_inflight"].as_u64(), r["queue_depth"].as_u64())
            == (Some(0), Some(0), Some(0))
    })
    .await;

    // The dropped stream ended as cancelled, not as a full generation.
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().unwrap();
    let series = |outcome: &str| {
        format!(
            "hangar_requests_total{{endpoint=\"chat_completions\",model=\"solo\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(metric(metrics, &series("cancelled")), Some("1"), "{metrics}");
    // The search for a prompt and the second request.
    assert!(metric(metrics, &series("ok")).is_some(), "{metrics}");
    assert_eq!(metric(metrics, "hangar_model_inflight_requests{model=\"solo\"}"), Some("0"));
    assert_eq!(metric(metrics, "hangar_model_runtime_inflight{model=\"solo\"}"), Some("0"));
    assert_eq!(row(&server, "solo").await["runtime_state"], "loaded");
}
