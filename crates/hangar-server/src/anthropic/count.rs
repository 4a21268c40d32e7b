//! `POST /v1/messages/count_tokens` for models whose engine takes OpenAI requests, counted
//! by the engine's own template and tokenizer on the chat completion body a generation
//! would send (`forward.rs`), so the count equals that generation's `prompt_tokens`:
//!
//! - `llama_server`: `POST /apply-template` (the prompt the chat route would render), then
//!   `POST /tokenize` with the special tokens added, as the chat route tokenizes it.
//! - `vllm_serve`: `POST /tokenize` with the messages and tools.
//! - `openai_remote`: the remote's own `POST /v1/messages/count_tokens` with the client's
//!   body; a remote without it answers 501 `not_implemented`.

use bytes::Bytes;
use hangar_config::BackendKind;
use hangar_runtime::RequestGuard;
use hangar_runtime::engine::{ForwardRequest, ForwardRoute, ThinkingMode};
use serde_json::{Map, Value, json};

use super::forward::{Forwarded, chat_body};
use crate::error::{ApiError, RuntimeCode};
use crate::openai::forward::read_whole;
use crate::router::Ctx;

/// The prompt tokens of `forwarded` on `model`'s engine.
///
/// # Errors
/// 501 `not_implemented` where the engine cannot count (an image on `llama_server`, whose
/// `/tokenize` does not see images; a remote without the route); the engine's errors.
pub(crate) async fn count(
    ctx: &Ctx,
    guard: &RequestGuard,
    model: &str,
    forwarded: &Forwarded,
) -> Result<u32, ApiError> {
    let max_answer_bytes = ctx.state.options.limits.max_answer_bytes.get();
    let call = |route: ForwardRoute, body: Value, thinking: ThinkingMode| async move {
        let request = ForwardRequest {
            route,
            body: Bytes::from(body.to_string()),
            thinking,
            max_answer_bytes,
        };
        let answer = guard.forward(request).await.map_err(super::manager_error)?;
        let whole = read_whole(guard, answer.body).await?;
        serde_json::from_slice::<Value>(&whole).map_err(|e| {
            ApiError::new(
                RuntimeCode::UpstreamError,
                format!("the engine's answer is not JSON: {e}"),
            )
        })
    };
    let thinking = forwarded.request.thinking;
    let counted = match forwarded.kind {
        BackendKind::LlamaServer => {
            if !forwarded.images.is_empty() {
                return Err(unsupported("llama-server's tokenizer route does not count images"));
            }
            let chat = chat_body(model, forwarded, false);
            let prompt = call(ForwardRoute::ApplyTemplate, chat, thinking).await?;
            let Some(prompt) = prompt["prompt"].as_str() else {
                return Err(malformed("/apply-template", "prompt"));
            };
            let body = json!({ "content": prompt, "add_special": true, "parse_special": true });
            let tokens = call(ForwardRoute::Tokenize, body, ThinkingMode::Default).await?;
            tokens["tokens"].as_array().map(|t| t.len() as u64)
        }
        BackendKind::VllmServe => {
            let chat = chat_body(model, forwarded, false);
            let mut body = Map::new();
            for key in ["model", "messages", "tools"] {
                if let Some(value) = chat.get(key) {
                    body.insert(key.to_owned(), value.clone());
                }
            }
            body.insert("add_generation_prompt".into(), true.into());
            let tokens = call(ForwardRoute::Tokenize, Value::Object(body), thinking).await?;
            tokens["count"].as_u64()
        }
        BackendKind::OpenaiRemote => {
            // The client's body as checked, for the canonical model name; the remote's
            // Messages API reads `thinking` itself.
            let mut body: Map<String, Value> = serde_json::from_slice(&ctx.body)
                .map_err(|e| ApiError::bad_request(format!("the body could not be read: {e}")))?;
            body.insert("model".into(), model.into());
            let route = ForwardRoute::MessagesCountTokens;
            let counted = call(route, Value::Object(body), ThinkingMode::Default).await?;
            counted["input_tokens"].as_u64()
        }
        _ => return Err(unsupported("the engine cannot count tokens")),
    };
    counted
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| malformed("its tokenizer", "a token count"))
}

/// 501 `not_implemented`.
fn unsupported(why: &str) -> ApiError {
    ApiError::new(RuntimeCode::NotImplemented, format!("counting tokens is not supported: {why}"))
}

/// 502 `upstream_error` for an answer without the field counted on.
fn malformed(route: &str, field: &str) -> ApiError {
    ApiError::new(RuntimeCode::UpstreamError, format!("the engine's {route} answer has no {field}"))
}
