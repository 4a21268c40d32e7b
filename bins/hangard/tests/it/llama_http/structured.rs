//! Structured outputs and tool calls (llama.cpp grammars).

use super::*;

// Structured outputs and tool calls (llama.cpp grammars)

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 12 },
            "unit": { "enum": ["celsius", "fahrenheit"] },
            "sunny": { "type": "boolean" }
        },
        "required": ["city", "unit", "sunny"],
        "additionalProperties": false
    })
}

fn assert_satisfies(text: &str, schema: &Value) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("test schema compiles");
    assert!(validator.is_valid(&value), "{value} does not satisfy {schema}");
}

/// A sampled (temperature 1) chat with `extra` fields.
fn sampled_chat(seed: u64, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{ "role": "user", "content": "What is the weather in Paris?" }],
        "max_tokens": 300,
        "temperature": 1.0,
        "seed": seed,
    });
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

#[tokio::test]
async fn json_schema_responses_satisfy_the_schema_streamed_or_not() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let schema = weather_schema();
    let format = json!({ "response_format": { "type": "json_schema",
        "json_schema": { "name": "weather", "strict": true, "schema": schema } } });
    for seed in 0..4 {
        let (status, body) =
            post(&server, "/v1/chat/completions", sampled_chat(seed, format.clone())).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        assert_satisfies(body["choices"][0]["message"]["content"].as_str().unwrap(), &schema);
    }
    let events =
        Sse::start(&server, "/v1/chat/completions", &streaming(sampled_chat(7, format), json!({})))
            .await
            .all()
            .await;
    let streamed = streamed(&events, "chat.completion.chunk");
    assert_eq!(streamed.finish_reason.as_deref(), Some("stop"));
    assert_satisfies(&streamed.text, &schema);

    // The Responses API spells it `text.format`, with the schema's fields flat.
    let request = json!({
        "model": "tiny", "input": "Weather?", "max_output_tokens": 300, "temperature": 1.0,
        "text": { "format": { "type": "json_schema", "name": "weather", "schema": schema } }
    });
    let (status, body) = post(&server, "/v1/responses", request).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("completed")), "{body}");
    assert_satisfies(body["output_text"].as_str().unwrap(), &schema);
    assert_eq!(body["text"]["format"]["type"], "json_schema", "{body}");
}

fn weather_tools() -> Value {
    json!([
        { "type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string", "maxLength": 10 }, "unit": { "enum": ["c", "f"] } },
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        } },
        { "type": "function", "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": { "utc_offset": { "type": "integer", "minimum": -12, "maximum": 14 } },
                "required": ["utc_offset"],
                "additionalProperties": false
            }
        } }
    ])
}

/// Checks one chat `tool_calls` entry against the tools; returns the function's name.
fn check_tool_call(call: &Value, tools: &Value) -> String {
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().expect("a name").to_owned();
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} is not one of the tools"));
    assert_satisfies(
        call["function"]["arguments"].as_str().unwrap(),
        &tool["function"]["parameters"],
    );
    name
}

#[tokio::test]
async fn forced_tool_choice_answers_with_a_well_formed_tool_call() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let tools = weather_tools();
    for seed in 0..4 {
        let required = json!({ "tools": tools, "tool_choice": "required" });
        let (status, body) =
            post(&server, "/v1/chat/completions", sampled_chat(seed, required)).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        assert_eq!(choice["message"]["content"], Value::Null, "{body}");
        assert_eq!(choice["message"]["tool_calls"].as_array().map(Vec::len), Some(1), "{body}");
        check_tool_call(&choice["message"]["tool_calls"][0], &tools);

        let named = json!({ "tools": tools, "tool_choice": { "type": "function", "function": { "name": "get_time" } } });
        let (_, body) = post(&server, "/v1/chat/completions", sampled_chat(seed, named)).await;
        let call = &body["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(check_tool_call(call, &tools), "get_time", "{body}");
    }

    // Streamed: one delta carries the whole call (index, id, name, arguments).
    let required = json!({ "tools": tools, "tool_choice": "required" });
    let body = streaming(sampled_chat(11, required), json!({}));
    let events = Sse::start(&server, "/v1/chat/completions", &body).await.all().await;
    let streamed = streamed(&events, "chat.completion.chunk");
    assert_eq!(streamed.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(streamed.text, "", "a forced call streams no content");
    let deltas: Vec<&Value> =
        streamed.chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(deltas.len(), 1, "{:?}", streamed.chunks);
    assert_eq!(deltas[0][0]["index"], 0);
    check_tool_call(&deltas[0][0], &tools);

    // The call and its result go back as history; the model answers again.
    let call = deltas[0][0].clone();
    let history = json!({
        "model": "tiny",
        "max_tokens": 8,
        "messages": [
            { "role": "user", "content": "What is the weather in Paris?" },
            { "role": "assistant", "content": null, "tool_calls": [call] },
            { "role": "tool", "tool_call_id": call["id"], "content": "{\"temp\": 21}" }
        ],
        "tools": tools
    });
    let (status, body) = post(&server, "/v1/chat/completions", history).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn responses_api_tool_calls_are_function_call_items() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let chat_tools = weather_tools();
    // The Responses API's tools are flat: {"type": "function", "name", "parameters"}.
    let tools: Vec<Value> = chat_tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut flat = t["function"].clone();
            flat["type"] = "function".into();
            flat
        })
        .collect();
    let request = json!({
        "model": "tiny", "input": "What time is it in Tokyo?", "max_output_tokens": 300,
        "temperature": 1.0, "tools": tools, "tool_choice": { "type": "function", "name": "get_time" }
    });
    let (status, body) = post(&server, "/v1/responses", request.clone()).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("completed")), "{body}");
    let items = body["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "only the call, no empty message: {body}");
    let item = &items[0];
    assert_eq!(
        (item["type"].as_str(), item["name"].as_str()),
        (Some("function_call"), Some("get_time"))
    );
    assert!(item["call_id"].as_str().is_some_and(|id| id.starts_with("call_")), "{item}");
    assert_satisfies(item["arguments"].as_str().unwrap(), &tools[1]["parameters"]);
    assert_eq!(body["tool_choice"]["name"], "get_time", "{body}");

    let mut streamed_request = request;
    streamed_request["stream"] = true.into();
    let events = Sse::start(&server, "/v1/responses", &streamed_request).await.all().await;
    let values = response_events(&events);
    let kinds: Vec<&str> = values.iter().filter_map(|v| v["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let done = &values[5]["item"];
    let completed = &values[6]["response"];
    assert_eq!(completed["output"][0], *done, "the final response repeats the streamed item");
    assert_eq!(values[4]["arguments"], done["arguments"]);
    assert_satisfies(done["arguments"].as_str().unwrap(), &tools[1]["parameters"]);

    // The call and its output go back as input items.
    let follow_up = json!({
        "model": "tiny", "max_output_tokens": 8, "tools": tools,
        "input": [
            { "role": "user", "content": "What time is it in Tokyo?" },
            { "type": "function_call", "call_id": done["call_id"], "name": "get_time", "arguments": done["arguments"] },
            { "type": "function_call_output", "call_id": done["call_id"], "output": "09:00" }
        ]
    });
    let (status, body) = post(&server, "/v1/responses", follow_up).await;
    assert_eq!(status, 200, "{body}");
}
