//! Messages API requests for models whose engine takes OpenAI requests (`llama_server`,
//! `vllm_serve`, `openai_remote`): the typed request written as a chat completion, forwarded
//! through the model's runtime (which renames the model and turns `thinking` into the
//! template's switch), and the engine's answer — JSON, or its chunk stream — read back into
//! content blocks: `reasoning_content` as thinking, `content` as text (reasoning written
//! inline split as on the typed path), `tool_calls` as tool uses.

use std::collections::VecDeque;

use bytes::Bytes;
use hangar_config::BackendKind;
use hangar_runtime::RequestGuard;
use hangar_runtime::engine::{
    FinishReason, ForwardRequest, ForwardRoute, GenerateRequest, GenerateSummary, OutputFormat,
    Prompt, Role, RuntimeError, ToolCall, ToolChoice,
};
use http::StatusCode;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::convert::Image;
use super::stream::{
    Blocks, MessageDelta, MessageMeta, Reasoning, StreamEvent, error_event, events, usage,
};
use crate::body::{SseSender, json_response, sse_response};
use crate::error::{ApiError, RuntimeCode};
use crate::openai::forward::{failed, read_whole};
use crate::openai::stream::send_all;
use crate::openai::{Recorder, Reply};
use crate::router::Ctx;

/// A request for an engine that takes OpenAI requests.
pub(crate) struct Forwarded {
    pub(crate) request: GenerateRequest,
    /// Its image blocks, written as `image_url` parts of their messages.
    pub(crate) images: Vec<Image>,
    /// The model's engine.
    pub(crate) kind: BackendKind,
}

/// The request as a chat completion body for the engine.
pub(crate) fn chat_body(model: &str, forwarded: &Forwarded, stream: bool) -> Value {
    let Forwarded { request, images, kind } = forwarded;
    let Prompt::Chat(chat) = &request.prompt else { return json!({}) };
    let mut messages = Vec::with_capacity(chat.len());
    // Tool results answer the calls before them, in order; the engines' templates want ids.
    let mut ids: VecDeque<String> = VecDeque::new();
    for (i, m) in chat.iter().enumerate() {
        let message = match m.role {
            Role::Assistant if !m.tool_calls.is_empty() => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .enumerate()
                    .map(|(j, call)| {
                        let id = format!("call_{i}_{j}");
                        ids.push_back(id.clone());
                        json!({ "id": id, "type": "function",
                            "function": { "name": call.name, "arguments": call.arguments } })
                    })
                    .collect();
                let content = (!m.content.is_empty()).then_some(m.content.as_str());
                json!({ "role": "assistant", "content": content, "tool_calls": calls })
            }
            Role::Tool => {
                let id = ids.pop_front().unwrap_or_else(|| format!("call_{i}"));
                json!({ "role": "tool", "tool_call_id": id, "content": m.content })
            }
            role => {
                let mut parts: Vec<Value> = images
                    .iter()
                    .filter(|image| image.message == i)
                    .map(
                        |image| json!({ "type": "image_url", "image_url": { "url": image.url() } }),
                    )
                    .collect();
                if parts.is_empty() {
                    json!({ "role": role.as_str(), "content": m.content })
                } else {
                    if !m.content.is_empty() {
                        parts.push(json!({ "type": "text", "text": m.content }));
                    }
                    json!({ "role": role.as_str(), "content": parts })
                }
            }
        };
        messages.push(message);
    }
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("messages".into(), messages.into());
    let p = &request.params;
    let fields = [
        ("max_tokens", p.max_tokens.map(Value::from)),
        ("temperature", p.temperature.map(|t| Value::from(f64::from(t)))),
        ("top_p", p.top_p.map(|t| Value::from(f64::from(t)))),
        ("top_k", p.top_k.map(Value::from)),
        ("stop", (!p.stop.is_empty()).then(|| Value::from(p.stop.clone()))),
    ];
    body.extend(fields.into_iter().filter_map(|(k, v)| Some((k.to_owned(), v?))));
    if let Some(tools) = &request.tools {
        // llama-server reads `tool_choice` as a word only: a named tool is forced there as
        // `required` with that tool alone.
        let named = match &tools.choice {
            ToolChoice::Function(name) if *kind == BackendKind::LlamaServer => Some(name),
            _ => None,
        };
        let functions: Vec<Value> = tools
            .tools
            .iter()
            .filter(|t| named.is_none_or(|name| t.name == *name))
            .map(|t| {
                let mut function = json!({ "name": t.name, "parameters": t.parameters });
                if let Some(description) = &t.description {
                    function["description"] = description.clone().into();
                }
                json!({ "type": "function", "function": function })
            })
            .collect();
        body.insert("tools".into(), functions.into());
        let choice = match &tools.choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Function(_) if named.is_some() => json!("required"),
            ToolChoice::Function(name) => {
                json!({ "type": "function", "function": { "name": name } })
            }
        };
        body.insert("tool_choice".into(), choice);
    }
    match &request.format {
        Some(OutputFormat::JsonObject) => {
            body.insert("response_format".into(), json!({ "type": "json_object" }));
        }
        Some(OutputFormat::JsonSchema(schema)) => {
            let format = json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": schema } });
            body.insert("response_format".into(), format);
        }
        None => {}
    }
    // llama-server names the stop sequence it met only in its debugging field.
    if *kind == BackendKind::LlamaServer && !p.stop.is_empty() {
        body.insert("verbose".into(), true.into());
    }
    if stream {
        body.insert("stream".into(), true.into());
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Value::Object(body)
}

/// Forwards `request` and answers with the message, whole or streamed.
pub(crate) async fn message(
    guard: RequestGuard,
    forwarded: Forwarded,
    meta: MessageMeta,
    reasoning: Reasoning,
    stream: bool,
    ctx: &Ctx,
    rec: &Recorder,
) -> Result<Reply, ApiError> {
    let body = chat_body(&meta.model, &forwarded, stream);
    let options = &ctx.state.options;
    let forward = ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from(body.to_string()),
        thinking: forwarded.request.thinking,
        max_answer_bytes: options.limits.max_answer_bytes.get(),
    };
    let answer = guard.forward(forward).await?;
    let streamed =
        answer.content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream"));
    if !streamed {
        let whole = read_whole(&guard, answer.body).await?;
        let value: Value = serde_json::from_slice(&whole).map_err(|e| {
            ApiError::new(
                RuntimeCode::UpstreamError,
                format!("the engine's answer is not JSON: {e}"),
            )
        })?;
        let mut read = Reader::new(reasoning);
        read.chunk(&value["choices"][0]["message"], &value);
        let (content, summary) = read.finish(&meta);
        rec.generation(&summary, std::time::Instant::now(), None);
        return Ok(Reply::Done(json_response(
            StatusCode::OK,
            &meta.message(content, Some(&summary)),
        )));
    }
    let (response, sse) = sse_response(options.http.stream_write_timeout);
    let rec = rec.clone();
    tokio::spawn(async move {
        let start = events(vec![
            StreamEvent::MessageStart { message: meta.message(Vec::new(), None) },
            StreamEvent::Ping,
        ]);
        let outcome = pump(&guard, answer.body, &sse, start, meta, reasoning).await;
        rec.record(outcome);
        drop(guard);
    });
    Ok(Reply::Streaming(response))
}

/// Reads the engine's chunks (or its one message) into blocks.
struct Reader {
    blocks: Blocks,
    /// Tool calls by index: id, name, arguments so far.
    calls: Vec<(String, String)>,
    finish: Option<String>,
    stopped_by: Option<String>,
    usage: (u32, u32, u32),
}

impl Reader {
    fn new(reasoning: Reasoning) -> Self {
        Self {
            blocks: Blocks::new(reasoning),
            calls: Vec::new(),
            finish: None,
            stopped_by: None,
            usage: (0, 0, 0),
        }
    }

    /// One chunk's `delta` (or the whole answer's `message`), and the chunk for its finish
    /// reason and usage.
    fn chunk(&mut self, delta: &Value, chunk: &Value) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for key in ["reasoning_content", "reasoning"] {
            if let Some(thinking) = delta[key].as_str().filter(|t| !t.is_empty()) {
                out.extend(self.blocks.reasoning(thinking));
                break;
            }
        }
        if let Some(text) = delta["content"].as_str() {
            out.extend(self.blocks.text(text));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(self.calls.len() as u64) as usize;
            while self.calls.len() <= index {
                self.calls.push((String::new(), String::new()));
            }
            let function = &call["function"];
            if let Some(name) = function["name"].as_str() {
                self.calls[index].0.push_str(name);
            }
            if let Some(arguments) = function["arguments"].as_str() {
                self.calls[index].1.push_str(arguments);
            }
        }
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish = Some(reason.to_owned());
        }
        if let Some(stop) = choice["stop_reason"].as_str() {
            self.stopped_by = Some(stop.to_owned());
        }
        let verbose = &chunk["__verbose"];
        if verbose["stop_type"] == "word"
            && let Some(word) = verbose["stopping_word"].as_str()
        {
            self.stopped_by = Some(word.to_owned());
        }
        let u = &chunk["usage"];
        if let Some(prompt) = u["prompt_tokens"].as_u64() {
            let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
            self.usage =
                (count(prompt), count(u["completion_tokens"].as_u64().unwrap_or(0)), count(cached));
        }
        out
    }

    /// The rest of the blocks (tool calls last, as the typed path sends them) and the summary.
    fn end(&mut self, meta: &MessageMeta) -> (Vec<StreamEvent>, GenerateSummary) {
        let mut out = self.blocks.finish();
        let called = !self.calls.is_empty();
        for (name, arguments) in std::mem::take(&mut self.calls) {
            out.extend(self.blocks.tool_call(&ToolCall { name, arguments }));
        }
        let finish_reason = match self.finish.as_deref() {
            Some("length") => FinishReason::Length,
            Some("tool_calls") => FinishReason::ToolCalls,
            _ if called => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        let stop_sequence = self
            .stopped_by
            .as_ref()
            .and_then(|s| meta.stops.iter().position(|stop| stop == s))
            .and_then(|i| u16::try_from(i).ok());
        let (prompt_tokens, completion_tokens, cached_tokens) = self.usage;
        let summary = GenerateSummary {
            finish_reason,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            stop_sequence,
        };
        (out, summary)
    }

    fn finish(mut self, meta: &MessageMeta) -> (Vec<super::types::OutputBlock>, GenerateSummary) {
        let (_, summary) = self.end(meta);
        (self.blocks.into_content(), summary)
    }
}

/// Translates the engine's chunk stream into the Messages API's events until either side
/// ends; the outcome's metrics label.
async fn pump(
    guard: &RequestGuard,
    mut body: mpsc::Receiver<Result<Bytes, RuntimeError>>,
    sse: &SseSender,
    start: Vec<Bytes>,
    meta: MessageMeta,
    reasoning: Reasoning,
) -> &'static str {
    let mut reader = Reader::new(reasoning);
    let mut buffer: Vec<u8> = Vec::new();
    if !send_all(sse, start).await {
        return "cancelled";
    }
    let aborted = guard.aborted();
    tokio::pin!(aborted);
    loop {
        let chunk = tokio::select! {
            error = &mut aborted => {
                let error = ApiError::from(error);
                let _ = send_all(sse, error_event(&error)).await;
                return error.code.as_str();
            }
            chunk = body.recv() => chunk,
            () = sse.closed() => return "cancelled",
        };
        match chunk {
            Some(Ok(bytes)) => {
                buffer.extend_from_slice(&bytes);
                while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                    let raw: Vec<u8> = buffer.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&raw);
                    for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                        let data = data.trim();
                        let Ok(value) = serde_json::from_str::<Value>(data) else { continue };
                        if value.get("error").is_some() {
                            let error = ApiError::new(
                                RuntimeCode::UpstreamError,
                                value["error"]["message"]
                                    .as_str()
                                    .unwrap_or("the engine failed")
                                    .to_owned(),
                            );
                            let _ = send_all(sse, error_event(&error)).await;
                            return error.code.as_str();
                        }
                        let out = reader.chunk(&value["choices"][0]["delta"], &value);
                        if !send_all(sse, events(out)).await {
                            return "cancelled";
                        }
                    }
                }
            }
            Some(Err(e)) => {
                let error = failed(guard, e).await;
                let _ = send_all(sse, error_event(&error)).await;
                return error.code.as_str();
            }
            None => break,
        }
    }
    let (mut out, summary) = reader.end(&meta);
    let (stop_reason, stop_sequence) = meta.stop(&summary);
    out.push(StreamEvent::MessageDelta {
        delta: MessageDelta { stop_reason, stop_sequence },
        usage: usage(&summary),
    });
    out.push(StreamEvent::MessageStop);
    if send_all(sse, events(out)).await { "ok" } else { "cancelled" }
}

#[cfg(test)]
mod tests {
    use hangar_runtime::engine::{ChatMessage, ToolDefinition, ToolUse};

    use super::*;

    #[test]
    fn a_tool_history_becomes_calls_with_the_ids_their_results_name() {
        let mut assistant = ChatMessage::new(Role::Assistant, "");
        assistant.tool_calls = vec![
            ToolCall { name: "a".into(), arguments: "{}".into() },
            ToolCall { name: "b".into(), arguments: r#"{"x":1}"#.into() },
        ];
        let mut request = GenerateRequest::new(Prompt::Chat(vec![
            ChatMessage::new(Role::User, "go"),
            assistant,
            ChatMessage::new(Role::Tool, "A"),
            ChatMessage::new(Role::Tool, "B"),
        ]));
        request.params.max_tokens = Some(8);
        request.params.stop = vec!["END".into()];
        request.tools = Some(ToolUse {
            tools: ["a", "b"]
                .map(|name| ToolDefinition {
                    name: name.into(),
                    description: None,
                    parameters: json!({}),
                })
                .into(),
            choice: ToolChoice::Function("a".into()),
        });
        let forwarded = Forwarded { request, images: Vec::new(), kind: BackendKind::LlamaServer };
        let body = chat_body("m", &forwarded, true);
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[1]["content"], Value::Null);
        assert_eq!(messages[1]["tool_calls"][1]["id"], "call_1_1");
        assert_eq!(messages[2]["tool_call_id"], "call_1_0");
        assert_eq!(messages[3]["tool_call_id"], "call_1_1");
        // llama-server takes a named tool as `required` with that tool alone.
        assert_eq!(
            body["tools"],
            json!([{ "type": "function", "function": { "name": "a", "parameters": {} } }])
        );
        assert_eq!(body["tool_choice"], "required");
        assert_eq!((body["max_tokens"].as_u64(), &body["stop"]), (Some(8), &json!(["END"])));
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["verbose"], true, "llama-server is asked to name its stop sequence");
        let vllm = Forwarded { kind: BackendKind::VllmServe, ..forwarded };
        let body = chat_body("m", &vllm, false);
        assert_eq!(body.get("verbose"), None);
        assert_eq!(body["tool_choice"]["function"]["name"], "a");
        assert_eq!(body["tools"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn images_become_image_url_parts_before_their_text() {
        use super::super::types::{ImageSource, MediaType};
        let request = GenerateRequest::new(Prompt::Chat(vec![
            ChatMessage::new(Role::User, "hi"),
            ChatMessage::new(Role::User, "what is it?"),
        ]));
        let source = ImageSource::Base64 { media_type: MediaType::Png, data: "AAAA".into() };
        let images = vec![Image { message: 1, at: "messages[1].content[1]".into(), source }];
        let forwarded = Forwarded { request, images, kind: BackendKind::VllmServe };
        let body = chat_body("m", &forwarded, false);
        assert_eq!(body["messages"][0]["content"], "hi");
        assert_eq!(
            body["messages"][1]["content"],
            json!([
                { "type": "image_url", "image_url": { "url": "data:image/png;base64,AAAA" } },
                { "type": "text", "text": "what is it?" }
            ])
        );
    }

    #[test]
    fn chunks_become_thinking_text_and_tool_uses() {
        let meta =
            MessageMeta { id: "msg_1".into(), model: "m".into(), stops: vec!["STOP".into()] };
        let mut reader = Reader::new(Reasoning::Shown);
        let chunks = [
            json!({ "choices": [{ "delta": { "reasoning_content": "hmm" } }] }),
            json!({ "choices": [{ "delta": { "content": "Hi" } }] }),
            json!({ "choices": [{ "delta": { "tool_calls": [{ "index": 0, "id": "c", "function": { "name": "f", "arguments": "{\"a\"" } }] } }] }),
            json!({ "choices": [{ "delta": { "tool_calls": [{ "index": 0, "function": { "arguments": ":1}" } }] }, "finish_reason": "tool_calls" }] }),
            json!({ "choices": [], "usage": { "prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": { "cached_tokens": 2 } } }),
        ];
        for chunk in &chunks {
            reader.chunk(&chunk["choices"][0]["delta"], chunk);
        }
        let (content, summary) = reader.finish(&meta);
        let kinds: Vec<Value> = content.iter().map(|b| serde_json::to_value(b).unwrap()).collect();
        assert_eq!(kinds[0]["thinking"], "hmm");
        assert_eq!(kinds[1]["text"], "Hi");
        assert_eq!((&kinds[2]["name"], &kinds[2]["input"]), (&json!("f"), &json!({ "a": 1 })));
        assert_eq!(summary.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            (summary.prompt_tokens, summary.completion_tokens, summary.cached_tokens),
            (9, 4, 2)
        );

        // vLLM names the stop sequence it met, llama-server in its debugging field.
        let vllm = json!({ "choices": [{ "message": { "content": "a" }, "finish_reason": "stop", "stop_reason": "STOP" }] });
        let llama = json!({ "choices": [{ "message": { "content": "a" }, "finish_reason": "stop" }],
            "__verbose": { "stop_type": "word", "stopping_word": "STOP" } });
        let eos = json!({ "choices": [{ "message": { "content": "a" }, "finish_reason": "stop" }],
            "__verbose": { "stop_type": "eos", "stopping_word": "" } });
        for (answer, named) in [(vllm, Some(0)), (llama, Some(0)), (eos, None)] {
            let mut reader = Reader::new(Reasoning::Shown);
            reader.chunk(&answer["choices"][0]["message"], &answer);
            let (_, summary) = reader.finish(&meta);
            assert_eq!(summary.stop_sequence, named, "{answer}");
        }
    }
}
