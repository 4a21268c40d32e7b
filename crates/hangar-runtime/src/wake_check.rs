//! The wake check: a short, deterministic question each runtime answers before it sleeps
//! (the reference) and again after it wakes, before it serves. A woken engine can say it
//! is healthy and still answer wrong (vLLM added such a check after users saw corrupted
//! output); an answer that differs from the runtime's own reference is caught here.
//!
//! The question fits the model's type: a greedy completion of a few tokens, an embedding,
//! a rerank score; through the engine's typed calls, or through its OpenAI-compatible
//! routes for engines that forward.

use bytes::Bytes;
use hangar_backend::{
    EmbedRequest, ForwardRequest, ForwardRoute, GenerateEvent, GenerateRequest, Prompt,
    RerankRequest, Runtime, RuntimeError, SamplingParams, ThinkingMode,
};
use hangar_config::ModelType;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The text the check asks about.
const TEXT: &str = "The capital of France is";
/// Tokens a completion asks for: enough to tell a broken engine (wrong weights or a broken
/// cache change the first greedy tokens), few enough to be quick — each token is a decode
/// step, the main cost of a wake on a small model (`docs/benchmarks.md`, swap).
const TOKENS: u32 = 2;
/// How far an embedding or score may move between two answers (a fresh context reorders no
/// sums; this is for engines that batch otherwise after a wake).
const TOLERANCE: f32 = 1e-3;
/// Largest answer a forwarded check reads.
const MAX_ANSWER: u64 = 1 << 20;

/// A runtime's answer to the check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// A greedy completion.
    Text(String),
    /// An embedding, or rerank scores.
    Numbers(Vec<f32>),
}

impl Answer {
    /// Whether `self` (after waking) is the same answer as `reference` (before sleeping).
    pub(crate) fn agrees(&self, reference: &Answer) -> bool {
        match (self, reference) {
            (Answer::Text(a), Answer::Text(b)) => a == b,
            (Answer::Numbers(a), Answer::Numbers(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= TOLERANCE)
            }
            _ => false,
        }
    }

    /// A short form for a message.
    pub(crate) fn brief(&self) -> String {
        match self {
            Answer::Text(text) => format!("{text:?}"),
            Answer::Numbers(n) => format!("{:?}", &n[..n.len().min(4)]),
        }
    }
}

/// `runtime`'s answer to the check for a model `name` of `model_type`.
///
/// # Errors
/// The engine's error.
pub(crate) async fn ask(
    runtime: &dyn Runtime,
    name: &str,
    model_type: ModelType,
) -> Result<Answer, RuntimeError> {
    if runtime.forwards() {
        return forwarded(runtime, name, model_type).await;
    }
    match model_type {
        ModelType::Llm => {
            let request = GenerateRequest {
                params: SamplingParams {
                    max_tokens: Some(TOKENS),
                    temperature: Some(0.0),
                    ..SamplingParams::default()
                },
                ..GenerateRequest::new(Prompt::Text(TEXT.to_owned()))
            };
            let (tx, mut rx) = mpsc::channel(64);
            let collect = async move {
                let mut text = String::new();
                while let Some(event) = rx.recv().await {
                    if let GenerateEvent::Text(piece) = event {
                        text.push_str(&piece);
                    }
                }
                text
            };
            let (summary, text) = tokio::join!(runtime.generate(request, tx), collect);
            summary.map(|_| Answer::Text(text))
        }
        ModelType::Embedding => {
            let request = EmbedRequest { inputs: vec![TEXT.to_owned()] };
            let embeddings = runtime.embed(request).await?;
            Ok(Answer::Numbers(embeddings.vectors.into_iter().next().unwrap_or_default()))
        }
        ModelType::Reranking => {
            let request = RerankRequest {
                query: TEXT.to_owned(),
                documents: vec!["Paris".to_owned(), "A river".to_owned()],
            };
            let rerankings = runtime.rerank(request).await?;
            Ok(Answer::Numbers(rerankings.scores))
        }
    }
}

/// The check through the engine's OpenAI-compatible routes.
async fn forwarded(
    runtime: &dyn Runtime,
    name: &str,
    model_type: ModelType,
) -> Result<Answer, RuntimeError> {
    let (route, body) = match model_type {
        ModelType::Llm => (
            ForwardRoute::Completions,
            json!({ "model": name, "prompt": TEXT, "max_tokens": TOKENS, "temperature": 0 }),
        ),
        ModelType::Embedding => {
            (ForwardRoute::Embeddings, json!({ "model": name, "input": [TEXT] }))
        }
        ModelType::Reranking => (
            ForwardRoute::Rerank,
            json!({ "model": name, "query": TEXT, "documents": ["Paris", "A river"] }),
        ),
    };
    let request = ForwardRequest {
        route,
        body: Bytes::from(body.to_string()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: MAX_ANSWER,
    };
    let mut response = runtime.forward(request).await?;
    let mut bytes = Vec::new();
    while let Some(chunk) = response.body.recv().await {
        bytes.extend_from_slice(&chunk?);
        if bytes.len() as u64 > MAX_ANSWER {
            return Err(RuntimeError::AnswerTooLarge { limit: MAX_ANSWER });
        }
    }
    let answer: Value = serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Failed {
        message: format!("the wake check's answer is not JSON: {e}"),
    })?;
    let numbers = |values: Option<&Vec<Value>>| {
        values.map(|v| v.iter().filter_map(Value::as_f64).map(|x| x as f32).collect())
    };
    let found = match model_type {
        ModelType::Llm => answer
            .pointer("/choices/0/text")
            .and_then(Value::as_str)
            .map(|t| Answer::Text(t.into())),
        ModelType::Embedding => {
            numbers(answer.pointer("/data/0/embedding").and_then(Value::as_array))
                .map(Answer::Numbers)
        }
        ModelType::Reranking => answer.get("results").and_then(Value::as_array).map(|results| {
            let mut scored: Vec<(u64, f32)> = results
                .iter()
                .filter_map(|r| {
                    let index = r.get("index")?.as_u64()?;
                    Some((index, r.get("relevance_score")?.as_f64()? as f32))
                })
                .collect();
            scored.sort_by_key(|(index, _)| *index);
            Answer::Numbers(scored.into_iter().map(|(_, score)| score).collect())
        }),
    };
    found.ok_or_else(|| RuntimeError::Failed {
        message: format!(
            "the wake check's answer has no result: {}",
            crate::journal::bounded(&answer.to_string())
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::Answer;

    #[test]
    fn answers_agree_when_equal_or_within_the_tolerance() {
        let text = |t: &str| Answer::Text(t.to_owned());
        assert!(text(" Paris.").agrees(&text(" Paris.")));
        assert!(!text(" Paris.").agrees(&text(" paris.")));
        let numbers = |n: &[f32]| Answer::Numbers(n.to_vec());
        assert!(numbers(&[0.5, -0.25]).agrees(&numbers(&[0.5005, -0.25])));
        assert!(!numbers(&[0.5, -0.25]).agrees(&numbers(&[0.51, -0.25])), "past the tolerance");
        assert!(!numbers(&[0.5]).agrees(&numbers(&[0.5, 0.0])), "another length");
        assert!(!text("0.5").agrees(&numbers(&[0.5])), "another kind");
    }
}
