//! Hangar's config vocabulary and the config merge.
//!
//! This crate owns everything a Hangar config *says*, and nothing that acts on it:
//!
//! - the vocabulary: [`ModelName`] (validated), [`ModelType`], [`Device`] (bitflags),
//!   [`BackendKind`], [`PromptFormat`] and the small enums backend fields use;
//! - the merge: `settings.json` (shipped defaults) deep-merged with `local.json`
//!   (machine-specific) by [`merge`]: objects merge key by key, arrays and scalars replace,
//!   an explicit `null` sets the value to `null`;
//! - typed model definitions, [`ModelConfig`], with per-backend settings in
//!   [`BackendSettings`], and the `definition` projection the admin API shows;
//! - validation that reports every problem at once with its JSON path
//!   (`models.qwen.gguf_n_ctx: must be >= 1`), unknown keys with a "did you mean", and
//!   fields that belong to another backend;
//! - the JSON Schema of the whole config ([`config_schema`]);
//! - the caps on what one request may ask and on leases per model ([`Limits`]);
//! - Lemonade's model-wide arguments mapped onto a model's own fields ([`LemonadeArgs`]),
//!   one mapping for `hangard serve`'s flags and `POST /api/v1/load`;
//! - the start-up plan: which enabled models load, in what order, and which their type's
//!   slots leave out ([`Config::start_up_plan`], [`Config::slot_warnings`]);
//! - the live-load fields a load request may override, each declared once with its UI
//!   constraint ([`LOAD_FIELDS`], [`load_constraints`]), the service's presets for them
//!   ([`load_recommendations`]), and the check of a load request's override patch against
//!   them ([`validate_load_override`]).
//!
//! It knows nothing of tokio, HTTP or engines.
//!
//! ```
//! use hangar_config::{Config, ModelType};
//!
//! let config = Config::from_value(&serde_json::json!({
//!     "models": {
//!         "qwen": { "backend": "llama_cpp", "model_path": "/m/qwen.gguf", "gguf_n_ctx": 8192 },
//!         "bge": { "backend": "stub", "labels": ["embedding"] }
//!     }
//! }))
//! .unwrap();
//! assert_eq!(config.model("bge").unwrap().model_type, ModelType::Embedding);
//! assert_eq!(config.model("qwen").unwrap().definition()["gguf_n_ctx"], 8192);
//! ```

mod children;
mod config;
mod connections;
mod constraint;
mod folder;
mod http;
mod kinds;
mod lemonade;
mod limits;
mod load_fields;
mod merge;
mod model;
mod name;
mod overrides;
mod quarantine;
mod recommendations;
mod repository;
mod request_args;
mod schema;
mod secret;
mod sections;
mod served;
mod start_up;
mod validate;
mod vram;

pub use children::{CHILD_ENV, ChildEnv, HANGAR_ENV, WITHHELD_ENV};
pub use config::{
    Config, ConfigError, DEFAULT_ADMIN_LOCK_TIMEOUT_S, DEFAULT_GRPC_PORT, DEFAULT_MAX_QUEUE_DEPTH,
    DEFAULT_MAX_REQUEST_BODIES_BYTES, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_PORT,
    MaxLoadedModels,
};
pub use connections::{
    ConnectionLimits, DEFAULT_BODY_READ_TIMEOUT_S, DEFAULT_HEADER_READ_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_KEYLESS_STREAMS,
    DEFAULT_MAX_REFUSED_CALLS,
};
pub use constraint::{ConstraintKind, LoadConstraint, LoadConstraints};
pub use folder::{
    DEFAULT_FOLDER_CONTEXT_TOKENS, DEFAULT_FOLDER_REPLICAS, DEFAULT_FOLDER_TARGET_INFLIGHT,
    DEFINITION_FILE, FOLDER_FIELDS, FolderRule, MAX_DEFINITION_BYTES, MAX_FOLDER_DEPTH,
    MAX_FOLDER_ENTRIES, RepositoryLimit, RepositoryLimits, folder_rule,
};
pub use http::{
    DEFAULT_SHUTDOWN_TIMEOUT_S, DEFAULT_STREAM_WRITE_TIMEOUT_S, HttpPolicy, normalize_origin,
    split_port,
};
pub use kinds::{BackendKind, Device, GgmlType, ModelType, PromptFormat, SpecType, Switch};
pub use lemonade::{LemonadeArg, LemonadeArgs, Mapped};
pub use limits::{
    DEFAULT_MAX_ANSWER_BYTES, DEFAULT_MAX_EMBEDDING_INPUTS, DEFAULT_MAX_LEASES_PER_MODEL,
    DEFAULT_MAX_LOG_BYTES, DEFAULT_MAX_LOG_LINE_BYTES, DEFAULT_MAX_MESSAGES,
    DEFAULT_MAX_RERANK_DOCUMENTS, DEFAULT_MAX_STOP_SEQUENCE_BYTES, DEFAULT_MAX_STOP_SEQUENCES,
    DEFAULT_MAX_TOOLS, Limits,
};
pub use load_fields::{
    LOAD_FIELDS, LoadField, LoadValueType, context_size_field, load_constraints, load_field,
    load_fields,
};
pub use merge::{LOCAL_FILE, SETTINGS_FILE, merge, merged, read_json, read_merged};
pub use model::{BackendSettings, DEFAULT_LOAD_TIMEOUT_S, MAX_GPUS, ModelConfig, cuda_indices};
pub use name::{MAX_MODEL_NAME_LEN, ModelName, ModelNameError};
pub use overrides::{LoadOverride, OverrideError, validate_load_override};
pub use quarantine::{
    DEFAULT_QUARANTINE_BACKOFF_S, DEFAULT_QUARANTINE_FAILURES, DEFAULT_QUARANTINE_MAX_BACKOFF_S,
    DEFAULT_QUARANTINE_WINDOW_S, QuarantinePolicy,
};
pub use recommendations::{LoadRecommendations, load_recommendations};
pub use repository::{ModelRepository, RepositoryModel};
pub use request_args::{LLAMA_SERVER_REQUEST_ARGS, check_request_args};
pub use schema::config_schema;
pub use secret::{REDACTED, Secret};
pub use sections::{
    BridgeSettings, Ct2Settings, ExllamaSettings, LLAMA_SERVER_MANAGED_ARGS, LlamaCppSettings,
    LlamaServerSettings, OpenAiRemoteSettings, StubSettings, VllmServeSettings, VllmSettings,
    parse_cache_quant,
};
pub use served::{MAX_SERVED_NAME_LEN, ServedName};
pub use start_up::{SlotWarning, StartUpChoice};
pub use validate::{ValidationError, json_kind};
pub use vram::{BudgetAmount, VramBudget};
