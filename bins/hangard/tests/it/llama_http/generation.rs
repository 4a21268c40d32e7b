//! Generation over HTTP: chat completions, completions and the Responses API, whole and
//! streamed.

use super::*;

// 1-3. Generation: chat completions, completions, Responses API

#[tokio::test]
async fn chat_completion_counts_tokens_and_stops_at_max_tokens() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;

    // Whatever the prompt, finish reason and usage agree (checked by chat_ok).
    for prompt in candidate_prompts().take(6) {
        chat_ok(&server, "tiny", &prompt, 4).await;
    }

    // max_tokens cuts a generation that does not end by itself.
    let long = running_prompt(&server, "tiny", 4).await;
    let body = chat_ok(&server, "tiny", &long, 4).await;
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");
    assert!(!body["choices"][0]["message"]["content"].as_str().unwrap().is_empty(), "{body}");

    // One that ends by itself says `stop`, before max_tokens.
    let short = stopping_prompt(&server, "tiny", 64).await;
    let body = chat_ok(&server, "tiny", &short, 64).await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");

    // max_completion_tokens wins over max_tokens.
    let mut request = chat_body("tiny", &long, 9);
    request["max_completion_tokens"] = 3.into();
    let (status, body) = post(&server, "/v1/chat/completions", request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");

    // The chat template wraps the message: more prompt tokens than the bare text has.
    let (status, raw) = post(
        &server,
        "/v1/completions",
        json!({ "model": "tiny", "prompt": "hello", "max_tokens": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{raw}");
    let templated = chat_ok(&server, "tiny", "hello", 1).await;
    assert!(
        templated["usage"]["prompt_tokens"].as_u64() > raw["usage"]["prompt_tokens"].as_u64(),
        "{templated} vs {raw}"
    );
}

#[tokio::test]
async fn greedy_chat_streams_the_same_text_as_the_non_streaming_answer() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    let long = running_prompt(&server, "tiny", 16).await;
    let short = stopping_prompt(&server, "tiny", 64).await;
    // (prompt, max_tokens, content chunks at least)
    for (prompt, max_tokens, min_pieces) in [(long.as_str(), 16, 2), (short.as_str(), 64, 1)] {
        let whole = chat_ok(&server, "tiny", prompt, max_tokens).await;
        let again = chat_ok(&server, "tiny", prompt, max_tokens).await;
        let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(again["choices"][0]["message"]["content"], content, "greedy is deterministic");

        let request = streaming(chat_body("tiny", prompt, max_tokens), json!({}));
        let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
        let stream = streamed(&events, "chat.completion.chunk");
        let first = &stream.chunks[0]["choices"][0]["delta"];
        assert_eq!(first["role"], "assistant", "the first delta has the role: {first}");
        assert_eq!(stream.text, content, "{prompt}: stream vs whole");
        assert!(stream.pieces >= min_pieces, "a chunk per token or so: {stream:?}");
        assert_eq!(
            stream.finish_reason.as_deref(),
            whole["choices"][0]["finish_reason"].as_str(),
            "{prompt}"
        );
        let last = stream.chunks.last().unwrap();
        assert_eq!(last["choices"][0]["delta"], json!({}), "the finish chunk: {last}");
        assert!(stream.chunks.iter().all(|c| c.get("usage").is_none()), "no usage unasked");

        // include_usage: one more chunk, with no choices and the same usage.
        let request = streaming(
            chat_body("tiny", prompt, max_tokens),
            json!({ "stream_options": { "include_usage": true } }),
        );
        let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
        let stream = streamed(&events, "chat.completion.chunk");
        assert_eq!(stream.text, content);
        let (usage_chunk, rest) = stream.chunks.split_last().unwrap();
        assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
        assert_eq!(
            counts(&usage_chunk["usage"]),
            counts(&whole["usage"]),
            "{usage_chunk} vs {whole}"
        );
        assert!(rest.iter().all(|c| c["usage"].is_null()), "usage only in the last chunk");
    }
}

#[tokio::test]
async fn completions_stream_and_whole_agree() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    let request =
        json!({ "model": "tiny", "prompt": "The hangar", "max_tokens": 12, "temperature": 0 });
    let (status, whole) = post(&server, "/v1/completions", request.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion", "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap();
    check_usage(&whole["usage"], whole["choices"][0]["finish_reason"].as_str(), 12);

    let events = Sse::start(&server, "/v1/completions", &streaming(request.clone(), json!({})))
        .await
        .all()
        .await;
    let stream = streamed(&events, "text_completion");
    assert_eq!(stream.text, text);
    assert_eq!(stream.finish_reason.as_deref(), whole["choices"][0]["finish_reason"].as_str());

    let usage_request =
        streaming(request.clone(), json!({ "stream_options": { "include_usage": true } }));
    let events = Sse::start(&server, "/v1/completions", &usage_request).await.all().await;
    let stream = streamed(&events, "text_completion");
    assert_eq!(counts(&stream.chunks.last().unwrap()["usage"]), counts(&whole["usage"]));

    // echo puts the prompt first, in both forms.
    let mut echo = request.clone();
    echo["echo"] = true.into();
    let (status, echoed) = post(&server, "/v1/completions", echo.clone()).await;
    assert_eq!(status, 200, "{echoed}");
    assert_eq!(echoed["choices"][0]["text"], format!("The hangar{text}"));
    let events =
        Sse::start(&server, "/v1/completions", &streaming(echo, json!({}))).await.all().await;
    assert_eq!(streamed(&events, "text_completion").text, format!("The hangar{text}"));
}

#[tokio::test]
async fn responses_stream_events_from_created_to_completed() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    // (input, max_output_tokens, the final status): one that ends by itself, one cut short.
    // A single user message renders as in chat, so the prompts found there behave alike.
    let short = stopping_prompt(&server, "tiny", 64).await;
    let long = running_prompt(&server, "tiny", 6).await;
    let cases = [(short.as_str(), 64, "completed"), (long.as_str(), 6, "incomplete")];
    for (input, max_output_tokens, status) in cases {
        let request = json!({ "model": "tiny", "input": input, "max_output_tokens": max_output_tokens, "temperature": 0 });
        let (status_code, whole) = post(&server, "/v1/responses", request.clone()).await;
        assert_eq!(status_code, 200, "{whole}");
        assert_eq!(
            (whole["object"].as_str(), whole["status"].as_str()),
            (Some("response"), Some(status)),
            "{whole}"
        );
        let text = whole["output_text"].as_str().unwrap();
        assert_eq!(whole["output"][0]["role"], "assistant", "{whole}");
        assert_eq!(whole["output"][0]["content"][0]["text"], text, "{whole}");
        let usage = &whole["usage"];
        let (input_tokens, output_tokens) =
            (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
        assert!(input_tokens > 0, "{usage}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(input_tokens + output_tokens));
        if status == "incomplete" {
            assert_eq!(output_tokens, max_output_tokens, "{usage}");
            assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens", "{whole}");
        } else {
            assert!(output_tokens < max_output_tokens, "{usage}");
        }

        let events =
            Sse::start(&server, "/v1/responses", &streaming(request, json!({}))).await.all().await;
        let values = response_events(&events);
        let kinds: Vec<&str> = values.iter().map(|v| v["type"].as_str().unwrap()).collect();
        let last = format!("response.{status}");
        assert_eq!(
            kinds[..4],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added"
            ],
            "{kinds:?}"
        );
        assert_eq!(
            kinds[kinds.len() - 4..],
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                last.as_str()
            ],
            "{kinds:?}"
        );
        let deltas: Vec<&Value> =
            values.iter().filter(|v| v["type"] == "response.output_text.delta").collect();
        assert_eq!(deltas.len(), kinds.len() - 8, "only deltas in between: {kinds:?}");
        assert!(!deltas.is_empty());
        let concatenated: String = deltas.iter().map(|d| d["delta"].as_str().unwrap()).collect();
        assert_eq!(concatenated, text, "the deltas make the non-streaming text");
        assert_eq!(values[kinds.len() - 4]["text"], text);
        let id = &values[0]["response"]["id"];
        assert_eq!(values[0]["response"]["status"], "in_progress");
        let finished = &values.last().unwrap()["response"];
        assert_eq!(&finished["id"], id, "one response id: {finished}");
        assert_eq!(finished["status"], status);
        assert_eq!(finished["output_text"], text);
        assert_eq!(counts(&finished["usage"]), counts(&whole["usage"]));
    }
}
