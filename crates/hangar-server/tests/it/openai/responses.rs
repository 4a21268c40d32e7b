//! The Responses API: its shape, thinking, and its stream's SDK event names.

use super::*;

#[tokio::test(start_paused = true)]
async fn responses_answer_in_the_responses_shape() {
    let svc = service().await;
    let (status, body) =
        post(&svc, "/v1/responses", json!({ "model": "fixed", "input": "hi" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "fixed");
    assert!(body["created_at"].as_u64().is_some());
    let message = &body["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        message["content"],
        json!([{ "type": "output_text", "text": "hello there friend", "annotations": [] }])
    );
    assert_eq!(body["output_text"], "hello there friend");
    assert_eq!(body["usage"]["input_tokens"], 1);
    assert_eq!(body["usage"]["output_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 4);

    // Messages with parts, instructions, and the TranslateGemma fields.
    let (status, body) = post(
        &svc,
        "/v1/responses",
        json!({
            "model": "fixed",
            "instructions": "translate",
            "input": [
                { "role": "user", "content": [{ "type": "input_text", "text": "Guten Tag" }] },
                { "type": "message", "role": "assistant", "content": [{ "type": "output_text", "text": "Good day" }] },
                { "role": "user", "content": "und weiter" }
            ],
            "source_lang_code": "de",
            "target_lang_code": "en",
            "max_output_tokens": 2,
            "store": false,
            "metadata": { "k": "v" }
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output_text"], "hello there");
    assert_eq!(body["status"], "incomplete", "max_output_tokens cut it short");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(body["instructions"], "translate");

    // Mixed-source input may omit the source; a source without a target is refused.
    let mixed = json!({ "model": "fixed", "input": "Hallo, hello", "target_lang_code": "fr" });
    assert_eq!(post(&svc, "/v1/responses", mixed).await.0, StatusCode::OK);
    let no_target = json!({ "model": "fixed", "input": "Hallo", "source_lang_code": "de" });
    assert_error(&post(&svc, "/v1/responses", no_target).await, 400, "invalid_request");

    let bad_item = json!({ "model": "fixed", "input": [{ "type": "web_search_call", "id": "x" }] });
    assert_error(&post(&svc, "/v1/responses", bad_item).await, 400, "invalid_request");
    // An item without a field its type requires fails the schema: 422, naming the item.
    let no_output =
        json!({ "model": "fixed", "input": [{ "type": "function_call_output", "call_id": "c" }] });
    let got = post(&svc, "/v1/responses", no_output).await;
    assert_error(&got, 422, "invalid_request_body");
    let message = got.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("input[0]") && message.contains("output"), "{message}");
    // A tool-use history is accepted (the stub ignores what it cannot show).
    let history = json!({ "model": "fixed", "input": [
        { "role": "user", "content": "weather?" },
        { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}" },
        { "type": "function_call_output", "call_id": "call_1", "output": "sunny" }
    ] });
    assert_eq!(post(&svc, "/v1/responses", history).await.0, StatusCode::OK);
    assert_error(
        &post(&svc, "/v1/responses", json!({ "model": "fixed" })).await,
        400,
        "invalid_request",
    );
    assert_error(
        &post(&svc, "/v1/responses", json!({ "input": "hi" })).await,
        400,
        "invalid_request",
    );
}

#[tokio::test(start_paused = true)]
async fn responses_thinking_must_be_a_capability_of_the_model() {
    let svc = service().await;
    for thinking in ["default", "enabled", "disabled"] {
        let (status, body) = post(
            &svc,
            "/v1/responses",
            json!({ "model": "thinker", "input": "hi", "thinking": thinking }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{thinking}: {body}");
        // Asked to think, the stub writes its reasoning into the text, as a reasoning model
        // does (the Messages API splits it into thinking blocks; these routes pass it on).
        let text = body["output_text"].as_str().unwrap();
        match thinking {
            "enabled" => assert_eq!(text, "<think> The prompt has 1 words. </think> deep thoughts"),
            _ => assert_eq!(text, "deep thoughts"),
        }
    }
    let (status, _) = post(
        &svc,
        "/v1/responses",
        json!({ "model": "fixed", "input": "hi", "thinking": "default" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for thinking in ["enabled", "disabled"] {
        let got = post(
            &svc,
            "/v1/responses",
            json!({ "model": "fixed", "input": "hi", "thinking": thinking }),
        )
        .await;
        assert_error(&got, 400, "thinking_unsupported");
    }
    // Capability checks come before admission: the model need not be loaded to learn it.
    let got = post(
        &svc,
        "/v1/responses",
        json!({ "model": "cold", "input": "hi", "thinking": "enabled" }),
    )
    .await;
    assert_error(&got, 400, "thinking_unsupported");
    let got = post(
        &svc,
        "/v1/responses",
        json!({ "model": "fixed", "input": "hi", "thinking": "maybe" }),
    )
    .await;
    assert_error(&got, 422, "invalid_request_body");
}

#[tokio::test(start_paused = true)]
async fn responses_stream_with_the_sdk_event_names() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/responses", json!({ "model": "fixed", "input": "hi", "stream": true }))
            .await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let data: Vec<Value> = events.iter().map(Event::json).collect();
    for (i, (event, name)) in data.iter().zip(&names).enumerate() {
        assert_eq!(event["type"], *name);
        assert_eq!(event["sequence_number"], i);
    }
    assert_eq!(data[0]["response"]["status"], "in_progress");
    let deltas: String = data[4..7].iter().map(|d| d["delta"].as_str().unwrap()).collect();
    assert_eq!(deltas, "hello there friend");
    assert_eq!(data[7]["text"], "hello there friend");
    let done = &data[10]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "hello there friend");
    assert_eq!(done["id"], data[0]["response"]["id"]);
}
