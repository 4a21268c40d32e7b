//! Admission through HTTP: typed errors for every state, queue limits, disconnects and
//! failures before and after a stream starts.

use super::*;

#[tokio::test(start_paused = true)]
async fn admission_errors_are_json_with_the_state_code_even_for_streams() {
    let svc = service().await;
    for stream in [false, true] {
        let extra = json!({ "stream": stream });
        let post_chat =
            |model: &str| post(&svc, "/v1/chat/completions", chat_body(model, "hi", extra.clone()));
        assert_error(&post_chat("nope").await, 404, "unknown_model");
        assert_error(&post_chat("cold").await, 503, "model_not_loaded");
        let failed = post_chat("broken").await;
        assert_error(&failed, 503, "model_failed");
        assert!(failed.1["error"]["message"].as_str().unwrap().contains("simulated OOM"));

        let completion = json!({ "model": "cold", "prompt": "hi", "stream": stream });
        assert_error(&post(&svc, "/v1/completions", completion).await, 503, "model_not_loaded");
        let response = json!({ "model": "broken", "input": "hi", "stream": stream });
        assert_error(&post(&svc, "/v1/responses", response).await, 503, "model_failed");
    }
    let embed = json!({ "model": "nope", "input": "x" });
    assert_error(&post(&svc, "/v1/embeddings", embed).await, 404, "unknown_model");
    let rerank = json!({ "model": "cold-rerank", "query": "q", "documents": ["d"] });
    assert_error(&post(&svc, "/v1/rerank", rerank).await, 503, "model_not_loaded");
}

#[tokio::test(start_paused = true)]
async fn an_embeddings_request_for_an_llm_with_auto_load_answers_400_and_loads_nothing() {
    let mut config = config();
    config["auto_load"] = json!(true);
    let svc = service_with(config).await;
    let state = |svc: &HangarService, name: &str| svc.manager().model(name).unwrap().runtime_state;
    let embed = json!({ "model": "cold", "input": "x" });
    let got = post(&svc, "/v1/embeddings", embed).await;
    assert_error(&got, 400, "model_type_mismatch");
    assert!(got.1["error"]["message"].as_str().unwrap().contains("type embedding"), "{}", got.1);
    let rerank = json!({ "model": "cold", "query": "q", "documents": ["d"] });
    assert_error(&post(&svc, "/v1/rerank", rerank).await, 400, "model_type_mismatch");
    let chat = chat_body("cold-rerank", "hi", json!({}));
    assert_error(&post(&svc, "/v1/chat/completions", chat).await, 400, "model_type_mismatch");
    assert_eq!(state(&svc, "cold").to_string(), "unloaded", "nothing was loaded");
    assert_eq!(state(&svc, "cold-rerank").to_string(), "unloaded");
    assert_eq!(svc.manager().counters().evictions, 0, "nothing was evicted");
    // The right type auto-loads.
    let rerank = json!({ "model": "cold-rerank", "query": "q", "documents": ["d"] });
    assert_eq!(post(&svc, "/v1/rerank", rerank).await.0, StatusCode::OK);
    assert_eq!(state(&svc, "cold-rerank").to_string(), "loaded");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_answers_429() {
    let mut config = config();
    config["max_queue_depth"] = json!(1);
    let svc = service_with(config).await;
    // One request runs on the only slot…
    let running = call(
        &svc,
        Method::POST,
        "/v1/chat/completions",
        &chat_body("slow", "a", json!({ "stream": true, "max_tokens": 100 })).to_string(),
    )
    .await;
    assert_eq!(running.status(), StatusCode::OK);
    // …one waits in the queue…
    let queued = tokio::spawn({
        let svc = svc.clone();
        async move {
            post(&svc, "/v1/chat/completions", chat_body("slow", "b", json!({ "max_tokens": 1 })))
                .await
        }
    });
    let mut waited = 0;
    while svc.manager().model("slow").unwrap().queue_depth < 1 {
        assert!(waited < 100, "the second request never queued");
        tokio::task::yield_now().await;
        waited += 1;
    }
    // …and the next one is refused.
    let refused = post(&svc, "/v1/chat/completions", chat_body("slow", "c", json!({}))).await;
    assert_error(&refused, 429, "queue_full");
    drop(running);
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(5), queued).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let svc = service().await;
    let body = chat_body("slow", "a long story", json!({ "stream": true, "max_tokens": 1000 }));
    let resp = call(&svc, Method::POST, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let role = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(std::str::from_utf8(&role).unwrap().contains("\"role\":\"assistant\""));
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("\"content\""));
    assert_eq!(svc.manager().model("slow").unwrap().runtime_inflight, 1);
    drop(body);

    // The only slot is free again long before the abandoned generation (1000 tokens at
    // 50 ms) could have finished.
    let next =
        post(&svc, "/v1/chat/completions", chat_body("slow", "short", json!({ "max_tokens": 2 })));
    let (status, answer) = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the second request was not admitted: the disconnected stream kept its slot");
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 2);
    let snapshot = svc.manager().model("slow").unwrap();
    assert_eq!((snapshot.runtime_inflight, snapshot.queue_depth), (0, 0));
    let text = metrics(&svc).await;
    assert!(
        text.contains(r#"hangar_requests_total{endpoint="chat_completions",model="slow",outcome="cancelled"} 1"#),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_after_the_stream_started_is_a_final_error_event() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/chat/completions", chat_body("crashy", "hi", json!({ "stream": true })))
            .await;
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data.len(), 4, "role chunk, the first word, error, [DONE]: {data:?}");
    assert_eq!(events[0].json()["choices"][0]["delta"]["role"], "assistant");
    assert!(events[1].json()["choices"][0]["delta"]["content"].is_string(), "{}", data[1]);
    let error = events[2].json();
    assert_eq!(error["error"]["code"], "backend_crashed", "{error}");
    assert_eq!(data[3], "[DONE]");
    assert_eq!(svc.manager().model("crashy").unwrap().runtime_state.as_str(), "failed");
    assert!(metrics(&svc).await.contains(
        r#"hangar_requests_total{endpoint="chat_completions",model="crashy",outcome="backend_crashed"} 1"#
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_fails_before_its_first_token_is_a_plain_error() {
    let svc = service().await;
    // The stub refuses tools before generating anything: the stream never starts, and the
    // client gets the status and code a non-streamed request gets.
    let weather = json!([{ "type": "function", "function": { "name": "get_weather" } }]);
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let body = if path == "/v1/responses" {
            json!({ "model": "fixed", "input": "hi", "stream": true,
                    "tools": [{ "type": "function", "name": "get_weather" }], "tool_choice": "required" })
        } else {
            chat_body(
                "fixed",
                "hi",
                json!({ "stream": true, "tools": weather, "tool_choice": "required" }),
            )
        };
        let response = call(&svc, Method::POST, path, &body.to_string()).await;
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/json",
            "{path}: a JSON error, not an event stream"
        );
        assert_error(&json_of(response).await, 400, "unsupported");
    }
    let metrics = metrics(&svc).await;
    assert!(metrics.contains(
        r#"hangar_requests_total{endpoint="chat_completions",model="fixed",outcome="unsupported"} 1"#
    ), "{metrics}");
    // The slot was released: the model still answers.
    let (status, _) = post(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}
