//! `POST /v1/rerank`: documents scored against a query, best first.

use hangar_runtime::Work;
use hangar_runtime::engine::RerankRequest;
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{PromptUsage, Recorder, Reply, new_id};
use crate::body::{Response, json_response, parse_json};
use crate::error::{ApiError, RuntimeCode};
use crate::metrics::Endpoint;
use crate::router::Ctx;

/// A document to rerank: a string, or an object with `text`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum RerankDocument {
    /// The document's text.
    Text(String),
    /// An object holding the document's text.
    Object(DocumentText),
}

/// A document's text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct DocumentText {
    /// The text.
    text: String,
}

impl RerankDocument {
    fn into_text(self) -> String {
        match self {
            Self::Text(text) | Self::Object(DocumentText { text }) => text,
        }
    }
}

/// Body of `POST /v1/rerank`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RerankBody {
    /// The configured reranking model's name.
    #[schemars(required, length(min = 1))]
    model: Option<String>,
    /// The query documents are scored against.
    #[schemars(required)]
    query: Option<String>,
    /// The candidate documents; must not be empty.
    #[schemars(required, length(min = 1))]
    documents: Option<Vec<RerankDocument>>,
    /// Return only the best `top_n` results; all when absent.
    #[schemars(range(min = 1))]
    top_n: Option<u32>,
    /// Include each result's document text (`document.text`). Default false.
    return_documents: Option<bool>,
}

/// One scored document.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RerankResult {
    /// The document's position in the request.
    index: u32,
    /// Its score; higher is more relevant.
    relevance_score: f32,
    /// With `return_documents`: the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

/// The answer of `POST /v1/rerank`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RerankResponse {
    /// Unique id (`rerank-…`).
    id: String,
    /// The model.
    model: String,
    /// The documents, most relevant first.
    results: Vec<RerankResult>,
    /// Token usage.
    usage: PromptUsage,
}

/// `POST /v1/rerank`.
pub(crate) async fn handle(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::Rerank);
    let reply = rerank(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn rerank(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let route = hangar_runtime::engine::ForwardRoute::Rerank;
    super::limits::check(ctx, rec, route)?;
    if let Some(reply) = super::forward::forwarded(ctx, rec, route).await {
        return reply;
    }
    let body: RerankBody = parse_json(&ctx.body, false)?;
    let model = rec.model(body.model)?;
    let query = body.query.ok_or_else(|| ApiError::bad_request("`query` is required"))?;
    let documents: Vec<String> =
        body.documents.unwrap_or_default().into_iter().map(RerankDocument::into_text).collect();
    if documents.is_empty() {
        return Err(ApiError::bad_request("`documents` must be a non-empty array"));
    }
    if body.top_n == Some(0) {
        return Err(ApiError::bad_request("`top_n` must be at least 1"));
    }
    let guard = ctx.state.manager.admit(&model, Work::Rerank).await?;
    let request = RerankRequest { query, documents: documents.clone() };
    let rerankings = guard.rerank(request).await?;
    drop(guard);
    if rerankings.scores.len() != documents.len() {
        return Err(ApiError::new(
            RuntimeCode::RuntimeError,
            format!(
                "the runtime returned {} scores for {} documents",
                rerankings.scores.len(),
                documents.len()
            ),
        ));
    }
    let mut order: Vec<usize> = (0..documents.len()).collect();
    order.sort_by(|&a, &b| rerankings.scores[b].total_cmp(&rerankings.scores[a]));
    order.truncate(body.top_n.map_or(usize::MAX, |n| n as usize));
    let return_documents = body.return_documents.unwrap_or(false);
    let results = order
        .into_iter()
        .map(|index| RerankResult {
            index: index as u32,
            relevance_score: rerankings.scores[index],
            document: return_documents.then(|| DocumentText { text: documents[index].clone() }),
        })
        .collect();
    let answer = RerankResponse {
        id: new_id("rerank-"),
        model,
        results,
        usage: PromptUsage::of(rerankings.prompt_tokens),
    };
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}
