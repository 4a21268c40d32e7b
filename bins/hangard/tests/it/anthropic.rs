//! The Messages API on the trained SmolLM2 (in-process llama.cpp, the model's own template):
//! the answer the chat route gives, a stop sequence named, count_tokens equal to usage, a
//! tool-use round trip with `tool_choice: any`, a stream equal to the whole answer, and a
//! client that hangs up cancelling its generation.

use serde_json::{Value, json};

use crate::support::engines::trained;
use crate::support::{Server, Sse, post, row};

const CHAT: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const QUESTION: &str = "What is the capital of France? Answer in one word.";

async fn server(path: &str) -> Server {
    let models = json!({ "smollm2": {
        "backend": "llama_cpp", "model_path": path, "enabled": true,
        "prompt_format": "auto", "gguf_n_ctx": 2048, "target_inflight": 2,
    } });
    let server = Server::start(&json!({ "models": models }), &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !reqwest::get(server.url("/readyz")).await.is_ok_and(|r| r.status() == 200) {
        assert!(std::time::Instant::now() < deadline, "not ready:\n{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "max_tokens": 24,
        "temperature": 0,
        "messages": [{ "role": "user", "content": QUESTION }]
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn message(server: &Server, body: Value) -> Value {
    let (status, answer) = post(server, "/v1/messages", body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn text(answer: &Value) -> String {
    let blocks = answer["content"].as_array().unwrap();
    blocks.iter().filter_map(|b| b["text"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trained_model_answers_stops_and_counts_as_the_messages_api_says() {
    let Some(path) = trained(CHAT) else { return };
    let server = server(&path).await;
    let answer = message(&server, ask(json!({}))).await;
    let said = text(&answer);
    assert!(said.contains("Paris"), "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    // The same greedy answer as the chat route: one template, one engine.
    let chat = json!({ "model": "smollm2", "max_tokens": 24, "temperature": 0,
        "messages": [{ "role": "user", "content": QUESTION }] });
    let (_, completion) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(completion["choices"][0]["message"]["content"], said.as_str());

    // count_tokens: the prompt as the generation read it.
    let (status, counted) = post(&server, "/v1/messages/count_tokens", ask(json!({}))).await;
    assert_eq!(status, 200, "{counted}");
    let usage = &answer["usage"];
    let read = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(counted["input_tokens"].as_u64(), Some(read), "{counted} vs {usage}");
    assert_eq!(Some(read), completion["usage"]["prompt_tokens"].as_u64());

    // A stop sequence from the middle of that answer ends it there and is named.
    let word = said.split_whitespace().last().unwrap().trim_matches('.').to_owned();
    let stopped = message(&server, ask(json!({ "stop_sequences": ["<never>", word] }))).await;
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], word.as_str());
    assert!(said.starts_with(&text(&stopped)), "{stopped} vs {said:?}");

    // Structured output: JSON that follows the schema, by constrained decoding.
    let schema = json!({ "type": "object", "properties": { "capital": { "type": "string" } }, "required": ["capital"] });
    let format = json!({ "max_tokens": 48, "output_config": { "format": { "type": "json_schema", "schema": schema } } });
    let structured = message(&server, ask(format)).await;
    let value: Value = serde_json::from_str(&text(&structured)).expect("JSON text");
    assert!(value["capital"].is_string(), "{structured}");

    // Streamed: the text deltas make the same answer.
    let mut streamed = Sse::start(&server, "/v1/messages", &ask(json!({ "stream": true }))).await;
    let mut deltas = String::new();
    let mut names = Vec::new();
    while let Some(event) = streamed.next().await {
        if let Some(piece) = event.json()["delta"]["text"].as_str() {
            deltas.push_str(piece);
        }
        names.push(event.name.unwrap_or_default());
    }
    assert_eq!(deltas, said);
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_use_round_trip_on_the_trained_model() {
    let Some(path) = trained(CHAT) else { return };
    let server = server(&path).await;
    let tools = json!([{
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }
    }]);
    let question = json!([{ "role": "user", "content": "What is the weather in Paris?" }]);
    let call = message(
        &server,
        ask(json!({
            "max_tokens": 64, "messages": question, "tools": tools, "tool_choice": { "type": "any" }
        })),
    )
    .await;
    assert_eq!(call["stop_reason"], "tool_use", "{call}");
    let blocks = call["content"].as_array().unwrap();
    let used = blocks.iter().find(|b| b["type"] == "tool_use").expect("a tool_use block");
    assert_eq!(used["name"], "get_weather");
    assert!(used["input"]["city"].is_string(), "{used}");
    assert!(used["id"].as_str().unwrap().starts_with("toolu_"));

    // The result goes back as a tool_result block; with `tool_choice: none` (a 135M model
    // would call again) the model answers in text.
    let turns = json!([
        question[0],
        { "role": "assistant", "content": blocks },
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": used["id"], "content": "18 degrees and sunny" }
        ] }
    ]);
    let answer = json!({ "max_tokens": 48, "messages": turns, "tools": tools, "tool_choice": { "type": "none" } });
    let reply = message(&server, ask(answer)).await;
    assert_ne!(reply["stop_reason"], "tool_use", "{reply}");
    assert!(reply["content"].as_array().unwrap().iter().all(|b| b["type"] == "text"), "{reply}");
    assert!(!text(&reply).trim().is_empty(), "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_hangs_up_cancels_its_generation() {
    let Some(path) = trained(CHAT) else { return };
    let server = server(&path).await;
    let long = ask(json!({ "stream": true, "max_tokens": 1500, "temperature": 1.0,
        "messages": [{ "role": "user", "content": "Write a very long story about the sea." }] }));
    let mut stream = Sse::start(&server, "/v1/messages", &long).await;
    let first = stream.next().await.expect("message_start");
    assert_eq!(first.name.as_deref(), Some("message_start"));
    assert_eq!(row(&server, "smollm2").await["inflight_requests"], 1);
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while row(&server, "smollm2").await["inflight_requests"] != 0 {
        assert!(std::time::Instant::now() < deadline, "the generation kept running");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let cancelled =
        r#"hangar_requests_total{endpoint="messages",model="smollm2",outcome="cancelled"} 1"#;
    assert!(metrics.contains(cancelled), "{metrics}");
}

/// The engines that take OpenAI requests: the Messages API translates to their chat route
/// and back. SmolLM2 under a `llama-server` child and through `openai_remote` to a
/// `llama-server` of its own give the in-process engine's greedy answer; the fake `vllm serve`
/// answers its words. Whole and streamed, usage as the chat route reports it, and
/// count_tokens equal to it.
#[tokio::test(flavor = "multi_thread")]
async fn engines_that_take_openai_requests_answer_through_translation() {
    let Some(path) = trained(CHAT) else { return };
    let remote =
        crate::support::engines::Standalone::start(&path, &["-c", "2048", "-np", "1"]).await;
    let models = json!({
        "smollm2": { "backend": "llama_cpp", "model_path": path, "enabled": true, "gguf_n_ctx": 2048 },
        "child": { "backend": "llama_server", "model_path": path, "enabled": true,
                   "llama_server_binary_path": crate::support::engines::llama_server_binary(),
                   "llama_server_n_ctx": 2048, "llama_server_extra_args": ["--no-webui"] },
        "remote": { "backend": "openai_remote", "enabled": true,
                    "openai_base_url": format!("http://127.0.0.1:{}/v1", remote.port()) },
        "vllm": { "backend": "vllm_serve", "enabled": true,
                  "vllm_binary_path": crate::support::engines::fake_vllm(), "vllm_model": "Qwen/Qwen3-0.6B" },
    });
    let server =
        Server::start(&json!({ "max_loaded_models": { "llm": 4 }, "models": models }), &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !reqwest::get(server.url("/readyz")).await.is_ok_and(|r| r.status() == 200) {
        assert!(std::time::Instant::now() < deadline, "not ready:\n{}", server.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let typed = text(&message(&server, ask(json!({}))).await);
    for model in ["child", "remote", "vllm"] {
        let whole = message(&server, ask(json!({ "model": model }))).await;
        assert_eq!(whole["model"], model);
        let said = text(&whole);
        let chat = json!({ "model": model, "max_tokens": 24, "temperature": 0,
            "messages": [{ "role": "user", "content": QUESTION }] });
        let (status, completion) = post(&server, "/v1/chat/completions", chat).await;
        assert_eq!(status, 200, "{completion}");
        assert_eq!(completion["choices"][0]["message"]["content"], said.as_str(), "{model}");
        let usage = &whole["usage"];
        let read = usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(Some(read), completion["usage"]["prompt_tokens"].as_u64(), "{model}: {whole}");
        if model != "vllm" {
            assert_eq!(said, typed, "{model}: the in-process engine's greedy answer");
        }
        let mut streamed =
            Sse::start(&server, "/v1/messages", &ask(json!({ "model": model, "stream": true })))
                .await;
        let (mut deltas, mut last) = (String::new(), None);
        while let Some(event) = streamed.next().await {
            let value = event.json();
            if let Some(piece) = value["delta"]["text"].as_str() {
                deltas.push_str(piece);
            }
            if value["type"] == "message_delta" {
                last = Some(value);
            }
        }
        assert_eq!(deltas, said, "{model}");
        let last = last.expect("message_delta");
        assert!(
            last["delta"]["stop_reason"].is_string()
                && last["usage"]["output_tokens"].as_u64() > Some(0),
            "{last}"
        );
        // Counted by the engine's own template and tokenizer: what the generation read.
        let (status, counted) =
            post(&server, "/v1/messages/count_tokens", ask(json!({ "model": model }))).await;
        assert_eq!((status, counted["input_tokens"].as_u64()), (200, Some(read)), "{model}");
    }
    // llama-server names the stop sequence it met.
    let word = typed.split_whitespace().next().unwrap().to_owned();
    let stopped =
        message(&server, ask(json!({ "model": "child", "stop_sequences": [word] }))).await;
    assert_eq!(
        (&stopped["stop_reason"], &stopped["stop_sequence"]),
        (&json!("stop_sequence"), &json!(word))
    );
    images_go_only_where_the_model_takes_them(&server).await;
}

/// A base64 image reaches `vllm serve` as an `image_url` part (the fake counts 64 prompt
/// tokens for it, in usage and in count_tokens alike); a model without images refuses it,
/// and an image by URL needs `allow_remote_media`.
async fn images_go_only_where_the_model_takes_them(server: &Server) {
    let png = json!({ "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" });
    let with = |model: &str, source: &Value| {
        ask(json!({ "model": model, "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "what is it?" },
            { "type": "image", "source": source }
        ] }] }))
    };
    let answer = message(server, with("vllm", &png)).await;
    assert_eq!(answer["usage"]["input_tokens"], 3 + 64, "{answer}");
    let (status, counted) = post(server, "/v1/messages/count_tokens", with("vllm", &png)).await;
    assert_eq!((status, counted["input_tokens"].as_u64()), (200, Some(3 + 64)), "{counted}");
    let url = json!({ "type": "url", "url": "http://169.254.169.254/latest/meta-data" });
    for (model, source, why) in [
        ("child", &png, "takes no images"),
        ("smollm2", &png, "takes no images"),
        ("vllm", &url, "allow_remote_media"),
    ] {
        let (status, refused) = post(server, "/v1/messages", with(model, source)).await;
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_request")));
        assert!(message.contains("messages[0].content[1]") && message.contains(why), "{refused}");
    }
}
