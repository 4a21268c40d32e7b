//! Legacy completions, plain and streamed.

use super::*;

#[tokio::test(start_paused = true)]
async fn completions_plain_and_streamed_agree() {
    let svc = service().await;
    let (status, plain) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    assert!(plain["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(plain["object"], "text_completion");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(text.split_whitespace().count(), 4);
    assert_eq!(plain["choices"][0]["finish_reason"], "length");
    assert_eq!(
        plain["usage"],
        json!({
            "prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6,
            "prompt_tokens_details": { "cached_tokens": 0 },
        })
    );

    let (_, listed) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": ["once upon"], "max_tokens": 4 }),
    )
    .await;
    assert_eq!(listed["choices"][0]["text"], text.as_str());

    let (_, echoed) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4, "echo": true }),
    )
    .await;
    assert_eq!(echoed["choices"][0]["text"], format!("once upon{text}"));

    let events = stream(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4, "stream": true,
                "stream_options": { "include_usage": true } }),
    )
    .await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let streamed: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[chunks.len() - 1]["usage"], plain["usage"]);
}

#[tokio::test(start_paused = true)]
async fn completions_refuse_batches_and_token_arrays() {
    let svc = service().await;
    for prompt in [json!(["a", "b"]), json!([1, 2, 3]), json!([[1, 2]]), json!(5)] {
        let got = post(&svc, "/v1/completions", json!({ "model": "chat", "prompt": prompt })).await;
        assert_error(&got, 400, "invalid_request");
    }
    assert_error(
        &post(&svc, "/v1/completions", json!({ "model": "chat" })).await,
        400,
        "invalid_request",
    );
}
