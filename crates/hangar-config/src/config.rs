//! [`Config`]: the whole effective configuration — global settings and every model.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::children::{ChildEnv, ChildrenFields};
use crate::connections::{ConnectionLimits, ConnectionsFields};
use crate::folder::{RepositoryLimits, RepositoryLimitsFields};
use crate::http::{HttpFields, HttpPolicy};
use crate::kinds::{BackendKind, ModelType};
use crate::limits::{Limits, LimitsFields};
use crate::model::ModelConfig;
use crate::name::ModelName;
use crate::quarantine::{QuarantineFields, QuarantinePolicy};
use crate::secret::Secret;
use crate::sections::Section;
use crate::validate::{Problems, ValidationError, check_nested, join_path, parse_flat};
use crate::vram::{BudgetAmount, VramBudget};

/// Why a config directory could not be turned into a [`Config`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A config file is missing or unreadable.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A config file is not valid JSON, or not a JSON object.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The merged config is valid JSON but breaks rules; every problem is listed.
    #[error("{}", InvalidList(.0))]
    Invalid(Vec<ValidationError>),
}

struct InvalidList<'a>(&'a [ValidationError]);

impl fmt::Display for InvalidList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} problem{} in config", if n == 1 { "" } else { "s" })?;
        for e in self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// The top-level keys of `settings.json`, as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SettingsFields {
    /// URL of a JSON Schema for editors; ignored by Hangar.
    #[serde(rename = "$schema")]
    pub(crate) schema: Option<String>,
    /// Address the HTTP server listens on. Default 127.0.0.1.
    pub(crate) host: Option<String>,
    /// Port the HTTP server listens on. Default 8080.
    pub(crate) port: Option<u16>,
    /// Port of the KServe v2 / Triton gRPC listener, on the same host. Default 8001 (as
    /// Triton); 0 turns it off.
    pub(crate) grpc_port: Option<u16>,
    /// Loaded-model slots per model type; a missing type gets 1.
    pub(crate) max_loaded_models: Option<MaxLoadedModelsFields>,
    /// Whether a request for an unloaded model loads it (per-model `auto_load` overrides).
    /// Default false.
    pub(crate) auto_load: Option<bool>,
    /// Bearer key required by the admin API; open when unset.
    pub(crate) admin_api_key: Option<Secret>,
    /// Bearer keys the inference routes accept (the admin key too); open when unset or
    /// empty. An inference key never opens an admin route.
    pub(crate) inference_api_keys: Option<Vec<Secret>>,
    /// Seconds an admin operation on a model (load, unload, pause, continue, weight update)
    /// waits for another one on the same model before answering 503 `admin_busy`.
    /// Default 300.
    pub(crate) admin_lock_timeout_s: Option<u64>,
    /// Requests that may wait in one model's queue before `queue_full`. Default 64.
    pub(crate) max_queue_depth: Option<u32>,
    /// Unload a model after this many seconds with nothing running or queued (a model's own
    /// `idle_unload_seconds` wins; pinned and leased models are kept). Never when unset.
    pub(crate) idle_unload_seconds: Option<u32>,
    /// Largest accepted request body in bytes. Default 8 MiB.
    pub(crate) max_request_body_bytes: Option<u64>,
    /// Bytes of request bodies held at once, all requests of the HTTP listener together;
    /// a body that would pass it is refused with 503 `request_bodies_full` and
    /// `Retry-After`. At least `max_request_body_bytes`. Default 256 MiB.
    pub(crate) max_request_bodies_bytes: Option<u64>,
    /// When a model that keeps failing to load or crashing stops being loaded on demand.
    pub(crate) quarantine: Option<QuarantineFields>,
    /// The HTTP edge: browser origins and hosts, what open routes show, stream and
    /// shutdown bounds.
    pub(crate) http: Option<HttpFields>,
    /// Caps on what one request may ask (list lengths, a deadline) and on leases per model.
    pub(crate) limits: Option<LimitsFields>,
    /// How many connections each listener holds and how long a connection may be slow.
    pub(crate) connections: Option<ConnectionsFields>,
    /// What of Hangar's environment the engine processes it starts get, beyond the built-in
    /// list; `HANGAR_*` never.
    pub(crate) children: Option<ChildrenFields>,
    /// Directory for Hangar's own state (the VRAM each model was measured to take), created
    /// when missing; relative to the working directory. Nothing persists across restarts
    /// when unset.
    pub(crate) state_dir: Option<String>,
    /// Bytes the saved prompt caches under `<state_dir>/prompt-cache` may take, all models
    /// together (oldest dropped first); `0` saves none. Default: 2% of the file system
    /// `state_dir` is on, at most 32 GiB. Nothing is saved without `state_dir`.
    pub(crate) prompt_cache_max_bytes: Option<u64>,
    /// GPU memory models may fill: MiB (`20000`), a percentage of each GPU's total
    /// (`"90%"`), or budgets by GPU index (`{"0": "90%", "1": 20000}`). When set, a load
    /// that does not fit evicts idle models for memory, or is refused with
    /// `insufficient_vram`. Unset: no admission by memory.
    #[schemars(with = "Option<crate::vram::VramBudgetSchema>")]
    pub(crate) vram_budget: Option<Value>,
    /// Host memory the models that run on the CPU may fill: MiB (`12000`) or a percentage
    /// of the machine's memory (`"75%"`). When set, a CPU model's load that does not fit
    /// evicts idle CPU models, or is refused with `insufficient_memory`. Unset: no
    /// admission by host memory.
    #[schemars(with = "Option<crate::vram::AmountSchema>")]
    pub(crate) ram_budget: Option<Value>,
    /// A folder whose subfolders are models beside the configured ones: a subfolder's name
    /// is the model's, its `hangar.json` its definition, held to the folder rules (see
    /// `docs/SECURITY.md`).
    pub(crate) model_repository: Option<String>,
    /// The model fields every repository subfolder's definition starts from (what a folder
    /// without `hangar.json` is served with): a model definition without `model_path`.
    pub(crate) model_repository_defaults: Option<Map<String, Value>>,
    /// The most a repository folder's own `hangar.json` may ask for (replicas, requests in
    /// flight, context, load time); the defaults are not held to them.
    pub(crate) model_repository_limits: Option<RepositoryLimitsFields>,
    /// The configured models, by name. A model set to `null` (e.g. in `local.json`) is
    /// removed.
    pub(crate) models: Option<Map<String, Value>>,
}

impl Section for SettingsFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.non_empty("host", self.host.as_deref());
        p.non_empty("admin_api_key", self.admin_api_key.as_ref().map(Secret::expose));
        for (i, key) in self.inference_api_keys.iter().flatten().enumerate() {
            p.non_empty(&format!("inference_api_keys[{i}]"), Some(key.expose()));
        }
        p.at_least("admin_lock_timeout_s", self.admin_lock_timeout_s, 1);
        p.at_least("max_queue_depth", self.max_queue_depth, 1);
        p.at_least("idle_unload_seconds", self.idle_unload_seconds, 1);
        p.at_least("max_request_body_bytes", self.max_request_body_bytes, 1);
        let one = self.max_request_body_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BODY_BYTES);
        p.at_least("max_request_bodies_bytes", self.max_request_bodies_bytes, one);
        if let Some(max) = &self.max_loaded_models {
            max.check(&mut p.nested("max_loaded_models"));
        }
        if let Some(q) = &self.quarantine {
            q.check(&mut p.nested("quarantine"));
        }
        if let Some(http) = &self.http {
            http.check(&mut p.nested("http"));
        }
        if let Some(l) = &self.limits {
            l.check(&mut p.nested("limits"));
        }
        if let Some(c) = &self.connections {
            c.check(&mut p.nested("connections"));
        }
        if let Some(c) = &self.children {
            c.check(&mut p.nested("children"));
        }
        if let Some(l) = &self.model_repository_limits {
            l.check(&mut p.nested("model_repository_limits"));
        }
        p.non_empty("state_dir", self.state_dir.as_deref());
        p.non_empty("model_repository", self.model_repository.as_deref());
        match self.vram_budget.as_ref().map(VramBudget::parse) {
            Some(Err((key, message))) if key.is_empty() => p.push("vram_budget", message),
            Some(Err((key, message))) => p.nested("vram_budget").push(&key, message),
            _ => {}
        }
        if let Some(Err(message)) = self.ram_budget.as_ref().map(BudgetAmount::parse) {
            p.push("ram_budget", message);
        }
    }
}

/// `max_loaded_models` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct MaxLoadedModelsFields {
    /// Chat / completion models. Default 1.
    llm: Option<u32>,
    /// Embedding models. Default 1.
    embedding: Option<u32>,
    /// Reranking models. Default 1.
    reranking: Option<u32>,
}

impl Section for MaxLoadedModelsFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("llm", self.llm, 1);
        p.at_least("embedding", self.embedding, 1);
        p.at_least("reranking", self.reranking, 1);
    }
}

/// How many models of each type may be loaded at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MaxLoadedModels {
    /// Chat / completion models.
    pub llm: NonZeroU32,
    /// Embedding models.
    pub embedding: NonZeroU32,
    /// Reranking models.
    pub reranking: NonZeroU32,
}

impl Default for MaxLoadedModels {
    fn default() -> Self {
        Self { llm: NonZeroU32::MIN, embedding: NonZeroU32::MIN, reranking: NonZeroU32::MIN }
    }
}

impl MaxLoadedModels {
    /// The limit for one model type.
    pub fn get(&self, ty: ModelType) -> NonZeroU32 {
        match ty {
            ModelType::Llm => self.llm,
            ModelType::Embedding => self.embedding,
            ModelType::Reranking => self.reranking,
        }
    }

    /// Limits from the CLI form `LLMS [EMBEDDINGS [RERANKINGS]]`; missing types get 1.
    ///
    /// # Errors
    /// When there are no counts or more than three, or a count is 0.
    pub fn from_counts(counts: &[u32]) -> Result<Self, String> {
        if counts.is_empty() || counts.len() > 3 {
            return Err(format!(
                "expected 1 to 3 counts (llm embedding reranking), got {}",
                counts.len()
            ));
        }
        let at = |i: usize| match counts.get(i) {
            None => Ok(NonZeroU32::MIN),
            Some(&n) => NonZeroU32::new(n)
                .ok_or_else(|| format!("the {} limit must be >= 1", ModelType::ALL[i])),
        };
        Ok(Self { llm: at(0)?, embedding: at(1)?, reranking: at(2)? })
    }
}

/// The effective configuration: `settings.json` merged with `local.json`, checked, with
/// defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address the HTTP server listens on.
    pub host: String,
    /// Port the HTTP server listens on.
    pub port: u16,
    /// Port of the gRPC listener; 0: none.
    pub grpc_port: u16,
    /// Loaded-model slots per model type.
    pub max_loaded_models: MaxLoadedModels,
    /// Whether requests for unloaded models load them (models may override).
    pub auto_load: bool,
    /// Bearer key for the admin API, if any.
    pub admin_api_key: Option<Secret>,
    /// Bearer keys for the inference routes; open when empty.
    pub inference_api_keys: Vec<Secret>,
    /// How long an admin operation waits for another on the same model.
    pub admin_lock_timeout: std::time::Duration,
    /// Bound of each model's request queue.
    pub max_queue_depth: NonZeroU32,
    /// Idle seconds before a model without its own setting is unloaded; never when `None`.
    pub idle_unload_seconds: Option<NonZeroU32>,
    /// Largest accepted request body in bytes.
    pub max_request_body_bytes: NonZeroU64,
    /// Bytes of request bodies held at once, all requests together.
    pub max_request_bodies_bytes: NonZeroU64,
    /// When models that keep failing are quarantined.
    pub quarantine: QuarantinePolicy,
    /// The HTTP edge's browser, disclosure, stream and shutdown rules.
    pub http: HttpPolicy,
    /// Caps on what one request may ask, and on leases per model.
    pub limits: Limits,
    /// What each listener allows its connections.
    pub connections: ConnectionLimits,
    /// Which of Hangar's environment variables engine children get.
    pub children: ChildEnv,
    /// Where Hangar keeps its own state across restarts; nowhere when `None`.
    pub state_dir: Option<PathBuf>,
    /// Bytes the saved prompt caches may take; `None`: the default share of the disk,
    /// `Some(0)`: none are saved.
    pub prompt_cache_max_bytes: Option<u64>,
    /// GPU memory models may fill; no admission by memory when `None`.
    pub vram_budget: Option<VramBudget>,
    /// Host memory CPU models may fill; no admission by host memory when `None`.
    pub ram_budget: Option<BudgetAmount>,
    /// The model repository folder (`model_repository`), if any; its models are read when
    /// the manager starts and on each rescan, not here.
    pub model_repository: Option<crate::ModelRepository>,
    /// Every configured model, in config order.
    pub models: Vec<ModelConfig>,
}

/// Default `admin_lock_timeout_s`.
pub const DEFAULT_ADMIN_LOCK_TIMEOUT_S: u64 = 300;
/// Default HTTP port.
pub const DEFAULT_PORT: u16 = 8080;
/// Default gRPC port (Triton's).
pub const DEFAULT_GRPC_PORT: u16 = 8001;
/// Default per-model queue bound.
pub const DEFAULT_MAX_QUEUE_DEPTH: u32 = 64;
/// Default request body limit (8 MiB).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 8 << 20;
/// Default `max_request_bodies_bytes`: 32 largest default bodies at once, far more than a
/// node's engines take in at a time, and a bound well inside a small pod's memory.
pub const DEFAULT_MAX_REQUEST_BODIES_BYTES: u64 = 256 << 20;

impl Config {
    /// Reads, merges and checks the config in `dir` (`settings.json` + optional
    /// `local.json`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file, position or JSON paths at fault.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        Self::from_value(&crate::read_merged(dir)?)
    }

    /// Checks an already merged config value.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] with every problem found.
    pub fn from_value(value: &Value) -> Result<Self, ConfigError> {
        let mut errors = Vec::new();
        let settings = parse_flat::<SettingsFields>(
            value,
            "",
            &[
                ("models", |_, _, _| {}),
                ("model_repository_defaults", crate::repository::check_defaults),
                ("max_loaded_models", check_nested::<MaxLoadedModelsFields>),
                ("quarantine", check_nested::<QuarantineFields>),
                ("http", check_nested::<HttpFields>),
                ("limits", check_nested::<LimitsFields>),
                ("connections", check_nested::<ConnectionsFields>),
                ("children", check_nested::<ChildrenFields>),
                ("model_repository_limits", check_nested::<RepositoryLimitsFields>),
            ],
            &mut errors,
        );
        // `models` is skipped above (only its type is checked there) and parsed here.
        let mut models = Vec::new();
        match value.get("models") {
            None | Some(Value::Null) => {}
            Some(Value::Object(entries)) => {
                for (name, entry) in entries {
                    if entry.is_null() {
                        continue;
                    }
                    match ModelName::new(name.as_str()) {
                        Err(e) => errors.push(ValidationError {
                            path: join_path("models", name),
                            message: format!("invalid model name: {e}"),
                        }),
                        Ok(name) => match ModelConfig::parse(&name, entry) {
                            Ok(model) => models.push(model),
                            Err(errs) => errors.extend(errs),
                        },
                    }
                }
            }
            // Reported by the key check above.
            Some(_) => {}
        }
        errors.extend(crate::served::claimed_twice(&models));
        match settings {
            Some(s) if errors.is_empty() => Ok(Self::resolve(s, models)),
            _ => Err(ConfigError::Invalid(errors)),
        }
    }

    fn resolve(s: SettingsFields, models: Vec<ModelConfig>) -> Self {
        let max = s.max_loaded_models.unwrap_or_default();
        let limit = |n: Option<u32>| n.and_then(NonZeroU32::new).unwrap_or(NonZeroU32::MIN);
        Self {
            host: s.host.unwrap_or_else(|| "127.0.0.1".into()),
            port: s.port.unwrap_or(DEFAULT_PORT),
            grpc_port: s.grpc_port.unwrap_or(DEFAULT_GRPC_PORT),
            max_loaded_models: MaxLoadedModels {
                llm: limit(max.llm),
                embedding: limit(max.embedding),
                reranking: limit(max.reranking),
            },
            auto_load: s.auto_load.unwrap_or(false),
            admin_api_key: s.admin_api_key,
            inference_api_keys: s.inference_api_keys.unwrap_or_default(),
            admin_lock_timeout: std::time::Duration::from_secs(
                s.admin_lock_timeout_s.unwrap_or(DEFAULT_ADMIN_LOCK_TIMEOUT_S),
            ),
            max_queue_depth: s
                .max_queue_depth
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::new(DEFAULT_MAX_QUEUE_DEPTH).unwrap_or(NonZeroU32::MIN)),
            max_request_body_bytes: s.max_request_body_bytes.and_then(NonZeroU64::new).unwrap_or(
                NonZeroU64::new(DEFAULT_MAX_REQUEST_BODY_BYTES).unwrap_or(NonZeroU64::MIN),
            ),
            // Never below one body: a larger `max_request_body_bytes` raises the default.
            max_request_bodies_bytes: s
                .max_request_bodies_bytes
                .and_then(NonZeroU64::new)
                .unwrap_or(
                    NonZeroU64::new(DEFAULT_MAX_REQUEST_BODIES_BYTES).unwrap_or(NonZeroU64::MIN),
                )
                .max(s.max_request_body_bytes.and_then(NonZeroU64::new).unwrap_or(NonZeroU64::MIN)),
            idle_unload_seconds: s.idle_unload_seconds.and_then(NonZeroU32::new),
            quarantine: s.quarantine.unwrap_or_default().into(),
            http: s.http.unwrap_or_default().into(),
            limits: s.limits.unwrap_or_default().into(),
            connections: s.connections.unwrap_or_default().into(),
            children: child_env(s.children.unwrap_or_default(), &models),
            state_dir: s.state_dir.map(PathBuf::from),
            prompt_cache_max_bytes: s.prompt_cache_max_bytes,
            // Checked by `SettingsFields::check`.
            vram_budget: s.vram_budget.as_ref().and_then(|v| VramBudget::parse(v).ok()),
            ram_budget: s.ram_budget.as_ref().and_then(|v| BudgetAmount::parse(v).ok()),
            model_repository: s.model_repository.map(|dir| crate::ModelRepository {
                dir: PathBuf::from(dir),
                defaults: s.model_repository_defaults,
                limits: RepositoryLimits::from(s.model_repository_limits.unwrap_or_default()),
            }),
            models,
        }
    }

    /// The model called `name`, if configured.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name.as_str() == name)
    }

    /// The effective config as JSON: every global setting with its default applied, and
    /// each model's [`definition`](ModelConfig::definition). Secrets are redacted.
    pub fn to_effective_json(&self) -> Value {
        let models: Map<String, Value> = self
            .models
            .iter()
            .map(|m| (m.name.to_string(), Value::Object(m.definition())))
            .collect();
        let mut all = self.settings_json();
        all.insert("models".into(), Value::Object(models));
        Value::Object(all)
    }

    /// Every global setting with its default applied, as [`Config::to_effective_json`]
    /// shows them, without the models (nothing per model is built).
    pub fn settings_json(&self) -> Map<String, Value> {
        let settings = serde_json::json!({
            "host": self.host,
            "port": self.port,
            "grpc_port": self.grpc_port,
            "max_loaded_models": self.max_loaded_models,
            "auto_load": self.auto_load,
            "admin_api_key": self.admin_api_key,
            "inference_api_keys": self.inference_api_keys,
            "admin_lock_timeout_s": self.admin_lock_timeout.as_secs(),
            "max_queue_depth": self.max_queue_depth,
            "idle_unload_seconds": self.idle_unload_seconds,
            "max_request_body_bytes": self.max_request_body_bytes,
            "max_request_bodies_bytes": self.max_request_bodies_bytes,
            "quarantine": {
                "failures": self.quarantine.failures,
                "window_seconds": self.quarantine.window.as_secs(),
                "backoff_seconds": self.quarantine.backoff.as_secs(),
                "max_backoff_seconds": self.quarantine.max_backoff.as_secs(),
            },
            "http": self.http.to_json(),
            "limits": self.limits.to_json(),
            "connections": self.connections.to_json(),
            "children": self.children.to_json(),
            "state_dir": self.state_dir,
            "prompt_cache_max_bytes": self.prompt_cache_max_bytes,
            "vram_budget": self.vram_budget.as_ref().map(VramBudget::to_json),
            "ram_budget": self.ram_budget,
            "model_repository": self.model_repository.as_ref().map(|r| &r.dir),
            "model_repository_defaults": self.model_repository.as_ref().map(|r| &r.defaults),
            "model_repository_limits": self.model_repository.as_ref().map(|r| r.limits.to_json()),
        });
        match settings {
            Value::Object(map) => map,
            _ => unreachable!("a JSON object literal"),
        }
    }
}

/// `children` with every model's `openai_api_key_env` withheld: the variable a remote
/// model's key is read from never reaches an engine child.
fn child_env(fields: ChildrenFields, models: &[ModelConfig]) -> ChildEnv {
    let mut env = ChildEnv::from(fields);
    for model in models {
        if let crate::BackendSettings::OpenaiRemote(remote) = &model.settings
            && let Some(var) = &remote.openai_api_key_env
            && !env.key_vars.contains(var)
        {
            env.key_vars.push(var.clone());
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_missing_types_with_one() {
        let one = NonZeroU32::MIN;
        let n = |v| NonZeroU32::new(v).unwrap();
        assert_eq!(
            MaxLoadedModels::from_counts(&[3]).unwrap(),
            MaxLoadedModels { llm: n(3), embedding: one, reranking: one }
        );
        assert_eq!(
            MaxLoadedModels::from_counts(&[5, 2, 4]).unwrap(),
            MaxLoadedModels { llm: n(5), embedding: n(2), reranking: n(4) }
        );
        assert_eq!(MaxLoadedModels::default(), MaxLoadedModels::from_counts(&[1]).unwrap());
        assert!(MaxLoadedModels::from_counts(&[]).is_err());
        assert!(MaxLoadedModels::from_counts(&[1, 1, 1, 1]).is_err());
        assert!(MaxLoadedModels::from_counts(&[2, 0]).unwrap_err().contains("embedding"));
    }
}
