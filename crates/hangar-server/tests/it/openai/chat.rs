//! Chat completions: content, usage, finish reasons, streams, and what validation refuses.

use super::*;

#[tokio::test(start_paused = true)]
async fn chat_completion_returns_content_usage_and_finish_reason() {
    let svc = service().await;
    let (status, body) =
        post(&svc, "/v1/chat/completions", chat_body("fixed", "say hi please", json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "fixed");
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "hello there friend");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
            "prompt_tokens_details": { "cached_tokens": 0 },
        })
    );

    let (_, body) = post(
        &svc,
        "/v1/chat/completions",
        chat_body("fixed", "say hi please", json!({ "max_tokens": 2 })),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello there");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 2);

    // max_completion_tokens wins over max_tokens.
    let (_, body) = post(
        &svc,
        "/v1/chat/completions",
        chat_body("fixed", "x", json!({ "max_tokens": 2, "max_completion_tokens": 1 })),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
}

#[tokio::test(start_paused = true)]
async fn chat_completion_accepts_parts_stop_and_unknown_openai_fields() {
    let svc = service().await;
    let body = json!({
        "model": "fixed",
        "messages": [
            { "role": "developer", "content": "be brief" },
            { "role": "user", "content": [{ "type": "text", "text": "hi" }, { "type": "text", "text": "there" }] },
            { "role": "assistant", "content": null },
            { "role": "user", "content": "again", "name": "bob" }
        ],
        "stop": "friend",
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "n": 1,
        "user": "someone",
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "logit_bias": {},
        "response_format": { "type": "text" },
        "tools": [],
        "parallel_tool_calls": false
    });
    let (status, body) = post(&svc, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "hello there");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "a stop sequence ends with stop");
    assert_eq!(body["choices"][0]["stop_reason"], "friend", "the one met is named, as vLLM does");

    let stops = chat_body("fixed", "hi", json!({ "stop": ["nothing", "there"] }));
    let (_, body) = post(&svc, "/v1/chat/completions", stops.clone()).await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
    assert_eq!(body["choices"][0]["stop_reason"], "there");
    let mut streamed = stops;
    streamed["stream"] = json!(true);
    let events = stream(&svc, "/v1/chat/completions", streamed).await;
    let finish = events[events.len() - 2].json();
    assert_eq!(finish["choices"][0]["stop_reason"], "there", "{finish}");
}

#[tokio::test(start_paused = true)]
async fn tools_and_response_formats_are_checked_before_the_engine_sees_them() {
    let svc = service().await;
    let weather = json!([{ "type": "function", "function": { "name": "get_weather" } }]);
    // Shapes serde cannot read are 422; what it reads but makes no sense is 400.
    let xml = chat_body("fixed", "hi", json!({ "response_format": { "type": "xml" } }));
    assert_error(&post(&svc, "/v1/chat/completions", xml).await, 422, "invalid_request_body");
    let unknown = chat_body(
        "fixed",
        "hi",
        json!({ "tools": weather, "tool_choice": {
        "type": "function", "function": { "name": "get_time" } } }),
    );
    assert_error(&post(&svc, "/v1/chat/completions", unknown).await, 400, "invalid_request");
    let both = chat_body(
        "fixed",
        "hi",
        json!({ "tools": weather, "response_format": { "type": "json_object" } }),
    );
    assert_error(&post(&svc, "/v1/chat/completions", both).await, 400, "invalid_request");
    // The stub has no decoder to constrain: an explicit refusal, not free text.
    let forced = chat_body("fixed", "hi", json!({ "tools": weather, "tool_choice": "required" }));
    assert_error(&post(&svc, "/v1/chat/completions", forced).await, 400, "unsupported");
    let json_mode =
        json!({ "model": "fixed", "input": "hi", "text": { "format": { "type": "json_object" } } });
    assert_error(&post(&svc, "/v1/responses", json_mode).await, 400, "unsupported");
    // `tool_choice: none` means no tools: the stub answers.
    let none = chat_body("fixed", "hi", json!({ "tools": weather, "tool_choice": "none" }));
    assert_eq!(post(&svc, "/v1/chat/completions", none).await.0, StatusCode::OK);
    // A history with tool calls and results is accepted.
    let history = json!({ "model": "fixed", "messages": [
        { "role": "user", "content": "weather?" },
        { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function",
            "function": { "name": "get_weather", "arguments": "{}" } }] },
        { "role": "tool", "tool_call_id": "call_1", "content": "sunny" }
    ] });
    assert_eq!(post(&svc, "/v1/chat/completions", history).await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn chat_stream_sends_role_deltas_finish_usage_and_done() {
    let svc = service().await;
    let extra = json!({ "max_tokens": 6, "seed": 1 });
    let (_, plain) =
        post(&svc, "/v1/chat/completions", chat_body("chat", "tell me a story", extra.clone()))
            .await;
    let expected = plain["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert_eq!(expected.split_whitespace().count(), 6);

    let mut body = chat_body("chat", "tell me a story", extra);
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let events = stream(&svc, "/v1/chat/completions", body).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!((chunk["id"].as_str(), &chunk["model"]), (Some(id), &json!("chat")));
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (finish, usage) = (&chunks[chunks.len() - 2], &chunks[chunks.len() - 1]);
    let text: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            assert_eq!(c["usage"], Value::Null);
            c["choices"][0]["delta"]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, expected, "the stream carries the same text as the plain answer");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], plain["usage"]);
}

#[tokio::test(start_paused = true)]
async fn chat_stream_without_usage_ends_with_finish_then_done() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({ "stream": true })))
            .await;
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data.len(), 1 + 3 + 1 + 1, "role, three words, finish, [DONE]: {data:?}");
    let finish = events[events.len() - 2].json();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(finish.get("usage").is_none());
}

#[tokio::test(start_paused = true)]
async fn chat_validation_errors() {
    let svc = service().await;
    let chat = |body: Value| {
        let svc = svc.clone();
        async move { post(&svc, "/v1/chat/completions", body).await }
    };
    assert_error(
        &chat(json!({ "messages": [{ "role": "user", "content": "hi" }] })).await,
        400,
        "invalid_request",
    );
    assert_error(&chat(json!({ "model": "fixed", "messages": [] })).await, 400, "invalid_request");
    assert_error(&chat(json!({ "model": "fixed" })).await, 400, "invalid_request");
    assert_error(&chat(chat_body("fixed", "hi", json!({ "n": 2 }))).await, 400, "invalid_request");
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "temperature": 3.0 }))).await,
        400,
        "invalid_request",
    );
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "max_tokens": 0 }))).await,
        400,
        "invalid_request",
    );
    let image = json!({ "model": "fixed", "messages": [{ "role": "user", "content": [
        { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }
    ] }] });
    assert_error(&chat(image).await, 400, "invalid_request");
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "thinking": "enabled" }))).await,
        400,
        "thinking_unsupported",
    );
    let ok = chat(chat_body("thinker", "hi", json!({ "thinking": "disabled" }))).await;
    assert_eq!(ok.0, StatusCode::OK, "{}", ok.1);
    assert_error(
        &chat(json!({ "model": "fixed", "messages": [{ "role": "wizard", "content": "hi" }] }))
            .await,
        422,
        "invalid_request_body",
    );

    let malformed = json_of(
        call(
            &svc,
            Method::POST,
            "/v1/chat/completions",
            "{\"model\": \"fixed\",\n  \"messages\": [}",
        )
        .await,
    )
    .await;
    assert_error(&malformed, 422, "invalid_request_body");
    let message = malformed.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 2"), "the parser position is kept: {message}");
}
