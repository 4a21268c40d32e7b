//! The messages of the bridge protocol (`PROTOCOL.md`), as typed values.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// A request to the worker (the `op` and its fields; the session adds the `id`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Opens the session.
    Hello {
        /// [`PROTOCOL_VERSION`].
        protocol: u32,
    },
    /// Loads the model.
    Load {
        /// `ct2`, `exllamav3` or `vllm`.
        engine: String,
        /// The effective definition the worker needs.
        model: LoadModel,
    },
    /// Generates text, streaming `token` replies.
    Generate(GenerateOp),
    /// Counts the prompt tokens a `generate` of the same fields would read.
    Count(GenerateOp),
    /// Embeds each input.
    Embed {
        /// Texts, in order.
        inputs: Vec<String>,
    },
    /// Scores documents against a query.
    Rerank {
        /// The query.
        query: String,
        /// The documents, in order.
        documents: Vec<String>,
    },
    /// Stops a running generation.
    Cancel {
        /// The generation's id.
        target: u64,
    },
    /// Liveness.
    Ping,
    /// Puts the model to sleep (vLLM's sleep mode); asleep already is Ok.
    Sleep {
        /// vLLM's level: 1 (weights to host memory) or 2 (weights discarded).
        level: u8,
    },
    /// Wakes a sleeping model; awake already is Ok.
    Wake,
    /// Releases the model; the process stays.
    Unload,
    /// Ends the worker.
    Shutdown,
}

impl Op {
    /// The op's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::Load { .. } => "load",
            Self::Generate(_) => "generate",
            Self::Count(_) => "count",
            Self::Embed { .. } => "embed",
            Self::Rerank { .. } => "rerank",
            Self::Cancel { .. } => "cancel",
            Self::Ping => "ping",
            Self::Sleep { .. } => "sleep",
            Self::Wake => "wake",
            Self::Unload => "unload",
            Self::Shutdown => "shutdown",
        }
    }
}

/// The `model` of a `load`.
#[derive(Debug, Clone, Serialize)]
pub struct LoadModel {
    /// The model's name.
    pub name: String,
    /// Its artifact (directory or id).
    pub model_path: Option<String>,
    /// `llm`, `embedding` or `reranking`.
    #[serde(rename = "type")]
    pub model_type: String,
    /// The configured prompt format (`auto` when unset).
    pub prompt_format: String,
    /// `cpu` or `gpu`: where the model runs.
    pub device: String,
    /// Requests in flight per replica.
    pub target_inflight: u32,
    /// This replica (0-based).
    pub replica: u32,
    /// Replicas of this load.
    pub replicas: u32,
    /// The backend's fields of the effective definition, unset ones omitted.
    pub settings: Map<String, Value>,
}

/// The fields of a `generate`.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateOp {
    /// Rendered text; `None` only for prompt format `auto`.
    pub prompt: Option<String>,
    /// Chat messages, for prompt format `auto`.
    pub messages: Option<Vec<Message>>,
    /// `default`, `enabled` or `disabled`.
    pub thinking: &'static str,
    /// Sampling and stopping.
    pub params: Params,
}

/// One chat message of an `auto`-format generation.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// Its text.
    pub content: String,
}

/// Sampling parameters of a `generate`.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Most tokens; `None` until the model stops or its context is full.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<u32>,
    /// Seed.
    pub seed: Option<u64>,
    /// Stop sequences.
    pub stop: Vec<String>,
}

/// A line from the worker: the `id` it answers and what it says.
#[derive(Debug, Clone, Deserialize)]
pub struct Incoming {
    /// The request it answers.
    pub id: u64,
    /// The message.
    #[serde(flatten)]
    pub reply: Reply,
}

/// What the worker says about one request; every variant but [`Reply::Token`] is final.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The answer to `hello`.
    Hello {
        /// The worker's protocol version.
        protocol: u32,
        /// The worker's name.
        #[serde(default)]
        worker: String,
        /// Its version.
        #[serde(default)]
        worker_version: String,
        /// Its Python version.
        #[serde(default)]
        python: String,
        /// Engines it has adapters for.
        #[serde(default)]
        engines: Vec<String>,
    },
    /// The answer to `load`.
    Loaded {
        /// Generations the engine runs at once, when it limits them.
        max_parallel_sequences: Option<u32>,
        /// Engine facts for the admin row.
        #[serde(default)]
        details: Map<String, Value>,
    },
    /// A piece of generated text.
    Token {
        /// Decoded text.
        text: String,
    },
    /// The end of a generation.
    Done {
        /// `stop` or `length`.
        finish_reason: String,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Generated tokens.
        completion_tokens: u32,
        /// The index (in `params.stop`) of the stop sequence that ended it, if one did.
        #[serde(default)]
        stop_sequence: Option<u16>,
    },
    /// The answer to `count`.
    Counted {
        /// Prompt tokens.
        prompt_tokens: u32,
    },
    /// The answer to `embed`.
    Embeddings {
        /// One vector per input.
        vectors: Vec<Vec<f32>>,
        /// Tokens consumed.
        prompt_tokens: u32,
    },
    /// The answer to `rerank`.
    Rerankings {
        /// One score per document.
        scores: Vec<f32>,
        /// Tokens consumed.
        prompt_tokens: u32,
    },
    /// Done (`cancel`, `sleep`, `wake`, `unload`, `shutdown`).
    Ok,
    /// The answer to `ping`.
    Pong,
    /// The request failed.
    Error {
        /// One of the protocol's codes.
        code: String,
        /// For people.
        message: String,
        /// The missing package, for `missing_package`.
        #[serde(default)]
        package: Option<String>,
    },
}

impl Reply {
    /// Whether this reply ends its request.
    pub fn is_final(&self) -> bool {
        !matches!(self, Self::Token { .. })
    }
}

/// One request as written on the wire.
#[derive(Serialize)]
pub(crate) struct Outgoing<'a> {
    pub(crate) id: u64,
    #[serde(flatten)]
    pub(crate) op: &'a Op,
}
