//! [`ModelConfig`]: one configured model, parsed and checked, and its `definition`
//! projection.

use std::num::NonZeroU32;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::kinds::{BackendKind, Device, ModelType, PromptFormat};
use crate::name::ModelName;
use crate::sections::*;
use crate::validate::{
    MODEL_SECTIONS, Problems, ValidationError, check_nested, join_path, json_kind, unknown_field,
};

/// The fields every model has, whatever its backend, as written in config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct ModelFields {
    /// Path of the model artifact: a GGUF file, a model directory, or a model id.
    pub(crate) model_path: Option<String>,
    /// The engine that runs the model. Required.
    pub(crate) backend: Option<BackendKind>,
    /// Device(s) the model occupies; the backend's default when unset.
    pub(crate) device: Option<Device>,
    /// The GPUs the model may use, by NVML index (PCI bus order); any when unset.
    pub(crate) gpus: Option<Vec<u32>>,
    /// How many GPUs one replica spreads over at once (a tensor split, an even share on
    /// each). Default 1, or `vllm_tensor_parallel_size` when that is set.
    pub(crate) gpu_split: Option<u32>,
    /// How chat messages become a prompt (llama_cpp).
    pub(crate) prompt_format: Option<PromptFormat>,
    /// Load this model when the server starts. Default false.
    pub(crate) enabled: Option<bool>,
    /// Runtimes (replicas) loaded for the model. Default 1.
    pub(crate) replicas: Option<u32>,
    /// Most replicas a load request may ask for. Default `replicas`.
    pub(crate) replica_max: Option<u32>,
    /// Requests in flight per replica before new ones queue. Default 1.
    pub(crate) target_inflight: Option<u32>,
    /// Free-form labels; `embedding` / `reranking` set the model type when `type` is unset.
    pub(crate) labels: Option<Vec<String>>,
    /// Other names the model is served under: in request bodies, percent-encoded (`%2F`)
    /// in paths, in `/v1/models`. Unlike the model's name an alias may contain `/`
    /// (`publishers/<ns>/models/<name>`); no name may belong to two models.
    pub(crate) aliases: Option<Vec<String>>,
    /// What the model serves: llm, embedding or reranking. From `labels` when unset.
    #[serde(rename = "type")]
    pub(crate) model_type: Option<ModelType>,
    /// Load on first request instead of refusing; the global `auto_load` when unset.
    pub(crate) auto_load: Option<bool>,
    /// Most tokens a generation makes when its request sets no `max_tokens`; unset, it
    /// runs until the model stops or its context is full (as OpenAI and llama-server do).
    pub(crate) default_max_tokens: Option<u32>,
    /// Seconds a load may take before it fails (engine processes: until the child answers
    /// on its health route). Default 300.
    pub(crate) load_timeout_s: Option<u32>,
    /// Never evicted to make room for another model (a load that could only proceed by
    /// evicting it fails with `slots_pinned`), nor unloaded for idleness. Default false.
    pub(crate) pinned: Option<bool>,
    /// Unload the model after this many seconds with nothing running or queued; the global
    /// `idle_unload_seconds` when unset; never when neither is set.
    pub(crate) idle_unload_seconds: Option<u32>,
    /// Put the model to sleep after this many seconds with nothing running or queued, when
    /// its engine can sleep (it stays loaded; a request wakes it); before
    /// `idle_unload_seconds`, which still unloads it later. Never when unset.
    pub(crate) idle_sleep_seconds: Option<u32>,
    /// Whether requests forwarded to the engine may name media by URL (`image_url`,
    /// `video_url`, `audio_url`, `file_url` with http, https or file), which the engine then
    /// fetches from this machine, inside its network. Refused with 400 when false: send media
    /// inline as `data:` URLs. Default false, except `openai_remote` (true: the remote server
    /// fetches from its own network).
    pub(crate) allow_remote_media: Option<bool>,
    /// Variables of Hangar's environment this model's engine processes get beyond
    /// `children`'s rules, by exact name: the default-withheld `HF_TOKEN` for a model on a
    /// gated hub repository, say. Never `HANGAR_*`.
    pub(crate) pass_env: Option<Vec<String>>,
}

impl Section for ModelFields {
    const BACKENDS: &'static [BackendKind] = &BackendKind::ALL;

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("replicas", self.replicas, 1);
        p.at_least("target_inflight", self.target_inflight, 1);
        p.at_least("replica_max", self.replica_max, 1);
        p.at_least("default_max_tokens", self.default_max_tokens, 1);
        p.at_least("load_timeout_s", self.load_timeout_s, 1);
        p.at_least("idle_unload_seconds", self.idle_unload_seconds, 1);
        p.at_least("idle_sleep_seconds", self.idle_sleep_seconds, 1);
        if let (Some(sleep), Some(unload)) = (self.idle_sleep_seconds, self.idle_unload_seconds)
            && sleep >= unload
            && unload >= 1
        {
            p.push(
                "idle_sleep_seconds",
                format!("must be < idle_unload_seconds ({unload}): sleep comes before unload"),
            );
        }
        if let (Some(max), Some(replicas)) = (self.replica_max, self.replicas)
            && max >= 1
            && max < replicas
        {
            p.push("replica_max", format!("must be >= replicas ({replicas})"));
        }
        p.non_empty("model_path", self.model_path.as_deref());
        p.within("gpu_split", self.gpu_split, 1, MAX_GPUS);
        if let Some(gpus) = &self.gpus {
            if gpus.is_empty() {
                p.push("gpus", "must list at least one GPU (leave it out for any)");
            }
            for (i, &gpu) in gpus.iter().enumerate() {
                if gpu >= MAX_GPUS {
                    p.push_item("gpus", i, format!("must be below {MAX_GPUS}"));
                } else if gpus[..i].contains(&gpu) {
                    p.push_item("gpus", i, format!("GPU {gpu} is listed twice"));
                }
            }
            if let Some(split) = self.gpu_split
                && !gpus.is_empty()
                && split as usize > gpus.len()
            {
                p.push("gpu_split", format!("must be <= the number of gpus ({})", gpus.len()));
            }
        }
        for (i, alias) in self.aliases.iter().flatten().enumerate() {
            if let Err(why) = crate::ServedName::new(alias.as_str()) {
                p.push_item("aliases", i, why);
            } else if self.aliases.iter().flatten().take(i).any(|a| a == alias) {
                p.push_item("aliases", i, format!("`{alias}` is listed twice"));
            }
        }
        crate::children::check_model_pass_env(self.pass_env.as_deref(), p);
        for (i, label) in self.labels.iter().flatten().enumerate() {
            if label.trim().is_empty() {
                p.nested("labels").push(&i.to_string(), "must not be empty");
            }
        }
    }
}

/// The backend-specific settings of a model; the variant always matches its backend.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BackendSettings {
    /// In-process llama.cpp.
    LlamaCpp(LlamaCppSettings),
    /// `llama-server` subprocess.
    LlamaServer(LlamaServerSettings),
    /// vLLM in the Python bridge.
    Vllm {
        /// Engine settings.
        engine: VllmSettings,
        /// Worker process settings.
        bridge: BridgeSettings,
    },
    /// `vllm serve` subprocess.
    VllmServe {
        /// Engine settings.
        engine: VllmSettings,
        /// Process settings.
        serve: VllmServeSettings,
    },
    /// ExLlamaV3 in the Python bridge.
    ExLlamaV3 {
        /// Cache and generator settings.
        exllama: ExllamaSettings,
        /// Worker process settings.
        bridge: BridgeSettings,
    },
    /// CTranslate2 in the Python bridge.
    Ct2 {
        /// Generator / translator settings.
        ct2: Ct2Settings,
        /// Worker process settings.
        bridge: BridgeSettings,
    },
    /// Remote OpenAI-compatible server.
    OpenaiRemote(OpenAiRemoteSettings),
    /// The test backend.
    Stub(StubSettings),
}

impl BackendSettings {
    /// The section values as JSON objects, for the `definition` projection.
    fn to_json(&self) -> Vec<Value> {
        fn to<T: Serialize>(section: &T) -> Value {
            serde_json::to_value(section).unwrap_or_default()
        }
        match self {
            Self::LlamaCpp(s) => vec![to(s)],
            Self::LlamaServer(s) => vec![to(s)],
            Self::Vllm { engine, bridge } => vec![to(engine), to(bridge)],
            Self::VllmServe { engine, serve } => vec![to(engine), to(serve)],
            Self::ExLlamaV3 { exllama, bridge } => vec![to(exllama), to(bridge)],
            Self::Ct2 { ct2, bridge } => vec![to(ct2), to(bridge)],
            Self::OpenaiRemote(s) => vec![to(s)],
            Self::Stub(s) => vec![serde_json::json!({ "stub": to(s) })],
        }
    }
}

/// One configured model: common fields with defaults applied, plus its backend's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model's name (its key under `models`).
    pub name: ModelName,
    /// The engine that runs it.
    pub backend: BackendKind,
    /// Path of the model artifact, when the backend uses one.
    pub model_path: Option<String>,
    /// Devices it occupies: `device` from config, else derived from the backend.
    pub device: Device,
    /// The GPUs it may use, by NVML index (PCI bus order), ascending; empty: any. From
    /// `gpus`, else from a `CUDA_VISIBLE_DEVICES` of indices in its configured environment.
    pub gpus: Vec<u32>,
    /// How many GPUs one replica spreads over at once (1: one GPU).
    pub gpu_split: NonZeroU32,
    /// Prompt format, when configured.
    pub prompt_format: Option<PromptFormat>,
    /// Whether it loads when the server starts.
    pub enabled: bool,
    /// Configured replica count.
    pub replicas: NonZeroU32,
    /// Most replicas one load may ask for (at least `replicas`).
    pub replica_max: NonZeroU32,
    /// Requests in flight per replica.
    pub target_inflight: NonZeroU32,
    /// Labels, as configured.
    pub labels: Vec<String>,
    /// Other names it is served under.
    pub aliases: Vec<crate::ServedName>,
    /// What it serves: explicit `type`, else from `labels`.
    pub model_type: ModelType,
    /// Per-model auto-load; `None` defers to the global setting.
    pub auto_load: Option<bool>,
    /// `max_tokens` of requests that set none; `None` generates until the model stops or
    /// the context is full.
    pub default_max_tokens: Option<NonZeroU32>,
    /// Seconds a load may take; [`DEFAULT_LOAD_TIMEOUT_S`] when unset.
    pub load_timeout_s: Option<NonZeroU32>,
    /// Never evicted, nor unloaded for idleness.
    pub pinned: bool,
    /// Idle seconds before the model is unloaded; `None` defers to the global setting.
    pub idle_unload_seconds: Option<NonZeroU32>,
    /// Idle seconds before the model is put to sleep (when its engine can sleep); `None`:
    /// never for idleness.
    pub idle_sleep_seconds: Option<NonZeroU32>,
    /// Whether forwarded requests may name media by URL; see [`Self::remote_media_allowed`].
    pub allow_remote_media: Option<bool>,
    /// Variables of Hangar's environment its engine processes get beyond `children`'s
    /// rules (exact names).
    pub pass_env: Vec<String>,
    /// Backend-specific settings.
    pub settings: BackendSettings,
    raw: Map<String, Value>,
}

/// GPUs a machine may have, as far as `gpus` and `gpu_split` go (NVML's own limit is 64).
pub const MAX_GPUS: u32 = 64;

/// Seconds a load may take when `load_timeout_s` is unset.
pub const DEFAULT_LOAD_TIMEOUT_S: u32 = 300;

/// Backends that cannot load anything without `model_path`.
const NEEDS_MODEL_PATH: &[BackendKind] = &[
    BackendKind::LlamaCpp,
    BackendKind::LlamaServer,
    BackendKind::Vllm,
    BackendKind::ExLlamaV3,
    BackendKind::Ct2,
];

impl ModelConfig {
    /// Parses and checks one model's object, reporting problems under `models.<name>`.
    ///
    /// # Errors
    /// Every problem found, each with its JSON path.
    pub fn parse(name: &ModelName, value: &Value) -> Result<Self, Vec<ValidationError>> {
        let mut errors = Vec::new();
        let path = join_path("models", name.as_str());
        match parse_model(name, value, &path, &mut errors) {
            Some(model) if errors.is_empty() => Ok(model),
            _ => Err(errors),
        }
    }

    /// The model's object as configured (after the settings/local merge).
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// How long a load may take: `load_timeout_s`, else [`DEFAULT_LOAD_TIMEOUT_S`].
    pub fn load_timeout(&self) -> std::time::Duration {
        let secs = self.load_timeout_s.map_or(DEFAULT_LOAD_TIMEOUT_S, NonZeroU32::get);
        std::time::Duration::from_secs(u64::from(secs))
    }

    /// Whether requests forwarded to this model's engine may name media by URL:
    /// `allow_remote_media`, else only for `openai_remote`.
    pub fn remote_media_allowed(&self) -> bool {
        self.allow_remote_media.unwrap_or(self.backend == BackendKind::OpenaiRemote)
    }

    /// Whether a request for this model may load it, given the global `auto_load`.
    pub fn auto_load_or(&self, global: bool) -> bool {
        self.auto_load.unwrap_or(global)
    }

    /// The `definition` projection used by the admin API: the common fields with defaults
    /// applied, plus every field of this model's backend (`null` where unset) and none of
    /// any other backend's. Secrets are redacted.
    pub fn definition(&self) -> Map<String, Value> {
        let mut out = Map::new();
        let mut put = |k: &str, v: Value| {
            out.insert(k.to_owned(), v);
        };
        put("model_path", self.model_path.clone().into());
        put("backend", self.backend.as_str().into());
        put("type", self.model_type.as_str().into());
        put("device", serde_json::to_value(self.device).unwrap_or_default());
        put("gpus", if self.gpus.is_empty() { Value::Null } else { self.gpus.clone().into() });
        put("gpu_split", self.gpu_split.get().into());
        put("prompt_format", serde_json::to_value(self.prompt_format).unwrap_or_default());
        put("enabled", self.enabled.into());
        put("replicas", self.replicas.get().into());
        put("replica_max", self.replica_max.get().into());
        put("target_inflight", self.target_inflight.get().into());
        put("labels", self.labels.clone().into());
        let aliases: Vec<Value> = self.aliases.iter().map(|a| a.as_str().into()).collect();
        put("aliases", aliases.into());
        put("auto_load", self.auto_load.into());
        put("default_max_tokens", self.default_max_tokens.map(NonZeroU32::get).into());
        put("load_timeout_s", self.load_timeout_s.map(NonZeroU32::get).into());
        put("pinned", self.pinned.into());
        put("idle_unload_seconds", self.idle_unload_seconds.map(NonZeroU32::get).into());
        put("idle_sleep_seconds", self.idle_sleep_seconds.map(NonZeroU32::get).into());
        put("allow_remote_media", self.remote_media_allowed().into());
        put("pass_env", self.pass_env.clone().into());
        for section in self.settings.to_json() {
            if let Value::Object(fields) = section {
                out.extend(fields);
            }
        }
        out
    }
}

fn parse_model(
    name: &ModelName,
    value: &Value,
    path: &str,
    errors: &mut Vec<ValidationError>,
) -> Option<ModelConfig> {
    let before = errors.len();
    let Some(obj) = value.as_object() else {
        errors.push(ValidationError {
            path: path.to_owned(),
            message: format!("expected an object, got {}", json_kind(value)),
        });
        return None;
    };
    let mut p = Problems::new(path.to_owned(), errors);

    let backend = match obj.get("backend") {
        None | Some(Value::Null) => {
            let kinds: Vec<_> = BackendKind::ALL.iter().map(|k| k.as_str()).collect();
            p.push("backend", format!("required; one of {}", kinds.join(", ")));
            None
        }
        Some(v) => match serde_json::from_value::<BackendKind>(v.clone()) {
            Ok(kind) => Some(kind),
            Err(e) => {
                p.push("backend", e.to_string());
                None
            }
        },
    };

    // Check every key on its own; keep the ones that parsed so the range and cross-field
    // checks below still run on them, and every problem is reported in one pass.
    let mut clean = Map::new();
    for (key, v) in obj {
        if key == "backend" {
            continue;
        }
        let Some(section) = MODEL_SECTIONS.iter().find(|s| s.has(key)) else {
            let usable = MODEL_SECTIONS
                .iter()
                .filter(|s| backend.is_none_or(|b| s.backends.contains(&b)))
                .flat_map(|s| s.fields.iter().map(String::as_str));
            let mut message = unknown_field(key, usable);
            if backend.is_some() && !message.contains("did you mean") {
                let all = MODEL_SECTIONS.iter().flat_map(|s| s.fields.iter().map(String::as_str));
                message = unknown_field(key, all);
            }
            p.push(key, message);
            continue;
        };
        if let Some(b) = backend.filter(|b| !section.backends.contains(b)) {
            let owners: Vec<_> = section.backends.iter().map(|k| k.as_str()).collect();
            let noun = if owners.len() == 1 { "backend" } else { "backends" };
            p.push(
                key,
                format!("belongs to {noun} {}, but this model's backend is {b}", owners.join(", ")),
            );
            continue;
        }
        let errors_before = p.errors_mut().len();
        if key == "stub" && v.is_object() {
            check_nested::<StubSettings>(v, &join_path(path, key), p.errors_mut());
        } else if let Err(message) = section.check_key(key, v) {
            p.push(key, message);
        }
        if p.errors_mut().len() == errors_before {
            clean.insert(key.clone(), v.clone());
        }
    }
    let clean = Value::Object(clean);

    let fields: ModelFields = section(&clean, &mut p);
    let backend = backend?;
    let settings = match backend {
        BackendKind::LlamaCpp => BackendSettings::LlamaCpp(section(&clean, &mut p)),
        BackendKind::LlamaServer => BackendSettings::LlamaServer(section(&clean, &mut p)),
        BackendKind::Vllm => BackendSettings::Vllm {
            engine: section(&clean, &mut p),
            bridge: section(&clean, &mut p),
        },
        BackendKind::VllmServe => BackendSettings::VllmServe {
            engine: section(&clean, &mut p),
            serve: section(&clean, &mut p),
        },
        BackendKind::ExLlamaV3 => BackendSettings::ExLlamaV3 {
            exllama: section(&clean, &mut p),
            bridge: section(&clean, &mut p),
        },
        BackendKind::Ct2 => {
            BackendSettings::Ct2 { ct2: section(&clean, &mut p), bridge: section(&clean, &mut p) }
        }
        BackendKind::OpenaiRemote => BackendSettings::OpenaiRemote(section(&clean, &mut p)),
        BackendKind::Stub => {
            BackendSettings::Stub(section::<StubSection>(&clean, &mut p).stub.unwrap_or_default())
        }
    };

    if let BackendSettings::VllmServe { engine, serve } = &settings
        && engine.sleeps()
    {
        for (field, set) in
            [("vllm_host", serve.vllm_host.is_some()), ("vllm_port", serve.vllm_port.is_some())]
        {
            if set {
                p.push(
                    field,
                    "cannot be set with vllm_enable_sleep_mode: the child then listens on a \
                     Unix socket only Hangar can reach (its sleep routes take no key)",
                );
            }
        }
    }
    if obj.get("model_path").is_none_or(Value::is_null) {
        let has_serve_model = matches!(
            &settings,
            BackendSettings::VllmServe { serve, .. } if serve.vllm_model.is_some()
        ) || obj.get("vllm_model").is_some_and(|v| !v.is_null());
        if NEEDS_MODEL_PATH.contains(&backend) {
            p.push("model_path", format!("required for backend {backend}"));
        } else if backend == BackendKind::VllmServe && !has_serve_model {
            p.push("model_path", "required for backend vllm_serve unless vllm_model is set");
        }
    }
    if p.errors_mut().len() > before {
        return None;
    }

    let device = fields.device.unwrap_or_else(|| derived_device(backend, &settings));
    let (gpus, gpu_split) = placement_fields(&fields, &settings, device, &mut p);
    if p.errors_mut().len() > before {
        return None;
    }
    let replicas = nonzero(fields.replicas);
    let labels = fields.labels.unwrap_or_default();
    Some(ModelConfig {
        name: name.clone(),
        backend,
        device,
        gpus,
        gpu_split,
        model_path: fields.model_path,
        prompt_format: fields.prompt_format,
        enabled: fields.enabled.unwrap_or(false),
        replicas,
        replica_max: fields.replica_max.and_then(NonZeroU32::new).unwrap_or(replicas),
        target_inflight: nonzero(fields.target_inflight),
        model_type: fields.model_type.unwrap_or_else(|| ModelType::from_labels(&labels)),
        labels,
        aliases: fields
            .aliases
            .into_iter()
            .flatten()
            .filter_map(|a| crate::ServedName::new(a).ok())
            .collect(),
        auto_load: fields.auto_load,
        default_max_tokens: fields.default_max_tokens.and_then(NonZeroU32::new),
        load_timeout_s: fields.load_timeout_s.and_then(NonZeroU32::new),
        pinned: fields.pinned.unwrap_or(false),
        idle_unload_seconds: fields.idle_unload_seconds.and_then(NonZeroU32::new),
        idle_sleep_seconds: fields.idle_sleep_seconds.and_then(NonZeroU32::new),
        allow_remote_media: fields.allow_remote_media,
        pass_env: fields.pass_env.unwrap_or_default(),
        settings,
        raw: obj.clone(),
    })
}

/// Where the model may run: `gpus` (else the indices of a `CUDA_VISIBLE_DEVICES` in its
/// configured environment, which the engine keeps) and `gpu_split` (else
/// `vllm_tensor_parallel_size`), checked against each other and the device.
fn placement_fields(
    fields: &ModelFields,
    settings: &BackendSettings,
    device: Device,
    p: &mut Problems<'_>,
) -> (Vec<u32>, NonZeroU32) {
    let (tensor_parallel, env) = match settings {
        BackendSettings::Vllm { engine, .. } => (engine.vllm_tensor_parallel_size, None),
        BackendSettings::VllmServe { engine, serve } => {
            (engine.vllm_tensor_parallel_size, serve.vllm_env.as_ref())
        }
        _ => (None, None),
    };
    let split = match (fields.gpu_split, tensor_parallel) {
        (Some(split), Some(tp)) if split != tp => {
            p.push(
                "gpu_split",
                format!("must equal vllm_tensor_parallel_size ({tp}) when both are set"),
            );
            split
        }
        (split, tp) => split.or(tp).unwrap_or(1),
    };
    let from_env =
        env.and_then(|env| env.get("CUDA_VISIBLE_DEVICES")).and_then(|v| cuda_indices(v));
    let mut gpus = fields.gpus.clone().or(from_env).unwrap_or_default();
    gpus.sort_unstable();
    gpus.dedup();
    if !device.contains(Device::GPU) && (fields.gpus.is_some() || split > 1) {
        p.push("gpus", "needs a model on a GPU (`device` includes gpu)");
    }
    if fields.gpus.is_none() && !gpus.is_empty() && split as usize > gpus.len() {
        p.push(
            "gpu_split",
            format!("must be <= the GPUs its CUDA_VISIBLE_DEVICES names ({})", gpus.len()),
        );
    }
    (gpus, NonZeroU32::new(split).unwrap_or(NonZeroU32::MIN))
}

/// The GPU indices a `CUDA_VISIBLE_DEVICES` value names; `None` when it names them
/// otherwise (UUIDs, MIG instances) or names none.
pub fn cuda_indices(value: &str) -> Option<Vec<u32>> {
    let indices: Option<Vec<u32>> =
        value.split(',').map(|v| v.trim().parse::<u32>().ok().filter(|&i| i < MAX_GPUS)).collect();
    indices.filter(|i| !i.is_empty())
}

/// Parses section `T` out of a model object whose keys were already checked, and runs its
/// range checks.
fn section<T: Section>(value: &Value, p: &mut Problems<'_>) -> T {
    let parsed: T = serde_json::from_value(value.clone()).unwrap_or_default();
    parsed.check(p);
    parsed
}

fn nonzero(v: Option<u32>) -> NonZeroU32 {
    v.and_then(NonZeroU32::new).unwrap_or(NonZeroU32::MIN)
}

/// The backend's default device, except that llama.cpp with no GPU layers runs on the CPU.
fn derived_device(backend: BackendKind, settings: &BackendSettings) -> Device {
    let gpu_layers = match settings {
        BackendSettings::LlamaCpp(s) => s.gguf_n_gpu_layers,
        BackendSettings::LlamaServer(s) => s.llama_server_n_gpu_layers,
        _ => None,
    };
    if gpu_layers == Some(0) { Device::CPU } else { backend.default_device() }
}
