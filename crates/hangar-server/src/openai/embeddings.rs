//! `POST /v1/embeddings`: embeddings of one text or several, as floats or base64.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hangar_runtime::Work;
use hangar_runtime::engine::EmbedRequest;
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{PromptUsage, Recorder, Reply, constant, shape};
use crate::body::{Response, json_response, parse_json};
use crate::error::ApiError;
use crate::metrics::Endpoint;
use crate::router::Ctx;

/// Embedding input: one string or a list of strings.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts, embedded in order.
    Texts(#[schemars(length(min = 1))] Vec<String>),
    /// Anything else (token arrays): refused with 400.
    #[schemars(skip)]
    Other(Value),
}

/// How embedding vectors are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EncodingFormat {
    /// Arrays of numbers.
    #[default]
    Float,
    /// Base64 of the little-endian `f32` bytes.
    Base64,
}

/// Body of `POST /v1/embeddings` (OpenAI's shape). Fields not listed here are accepted and
/// ignored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EmbeddingsRequest {
    /// The configured embedding model's name.
    #[schemars(required, length(min = 1))]
    model: Option<String>,
    /// A string or a non-empty list of strings. Token arrays are refused.
    #[schemars(required)]
    input: Option<EmbeddingInput>,
    /// `float` (default) or `base64`.
    encoding_format: Option<EncodingFormat>,
}

constant!(
    /// `list`.
    ListObject = "list"
);
constant!(
    /// `embedding`.
    EmbeddingObject = "embedding"
);

/// One embedding vector, as the request's `encoding_format` asks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum EmbeddingVector {
    /// `float`: the numbers.
    Float(Vec<f32>),
    /// `base64`: base64 of the little-endian `f32` bytes.
    Base64(String),
}

/// One embedding.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Embedding {
    /// Always `embedding`.
    object: EmbeddingObject,
    /// The input's position.
    index: u32,
    /// The L2-normalized vector.
    embedding: EmbeddingVector,
}

/// The answer of `POST /v1/embeddings`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EmbeddingList {
    /// Always `list`.
    object: ListObject,
    /// One embedding per input, in input order.
    data: Vec<Embedding>,
    /// The model.
    model: String,
    /// Token usage.
    usage: PromptUsage,
}

/// `POST /v1/embeddings`.
pub(crate) async fn handle(ctx: Ctx) -> Result<Response, ApiError> {
    let mut rec = Recorder::new(&ctx.state, Endpoint::Embeddings);
    let reply = embed(&ctx, &mut rec).await;
    rec.finish(reply)
}

async fn embed(ctx: &Ctx, rec: &mut Recorder) -> Result<Reply, ApiError> {
    let route = hangar_runtime::engine::ForwardRoute::Embeddings;
    super::limits::check(ctx, rec, route)?;
    if let Some(reply) = super::forward::forwarded(ctx, rec, route).await {
        return reply;
    }
    let body: EmbeddingsRequest = parse_json(&ctx.body, false)?;
    let model = rec.model(body.model)?;
    let inputs = match body.input {
        Some(EmbeddingInput::Text(text)) => vec![text],
        Some(EmbeddingInput::Texts(texts)) if !texts.is_empty() => texts,
        Some(EmbeddingInput::Texts(_)) => {
            return Err(ApiError::bad_request("`input` must not be an empty array"));
        }
        Some(EmbeddingInput::Other(value)) => {
            return Err(ApiError::bad_request(format!(
                "`input` must be a string or an array of strings, got {}; token arrays are not supported",
                shape(&value)
            )));
        }
        None => return Err(ApiError::bad_request("`input` is required")),
    };
    let format = body.encoding_format.unwrap_or_default();
    let guard = ctx.state.manager.admit(&model, Work::Embed).await?;
    let embeddings = guard.embed(EmbedRequest { inputs }).await?;
    drop(guard);
    let data = embeddings
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match format {
                EncodingFormat::Float => EmbeddingVector::Float(vector),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    EmbeddingVector::Base64(STANDARD.encode(bytes))
                }
            };
            Embedding { object: EmbeddingObject::Value, index: index as u32, embedding }
        })
        .collect();
    let answer = EmbeddingList {
        object: ListObject::Value,
        data,
        model,
        usage: PromptUsage::of(embeddings.prompt_tokens),
    };
    Ok(Reply::Done(json_response(StatusCode::OK, &answer)))
}
