//! What a model repository folder may say, and how its files are read.
//!
//! Whoever writes the repository (a download agent, a pull) is not the operator. A folder's
//! `hangar.json` is held to an allow-list ([`FOLDER_FIELDS`]): each field is free, capped by
//! a `model_repository_limits` key the operator sets, a path that must stay inside the folder
//! after symlinks, or the operator's alone; a field not on the list is refused until someone
//! lists it. Only regular files are read, with a size cap, and nothing in the folder may be
//! a link out of it, a pipe or a device (an engine, or Hangar's own header reads, would
//! follow or block on it).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// The definition file of a repository subfolder.
pub const DEFINITION_FILE: &str = "hangar.json";

/// Largest `hangar.json` read, in bytes.
pub const MAX_DEFINITION_BYTES: u64 = 1 << 20;

/// Most entries (files and folders, at any depth) a model folder may hold.
pub const MAX_FOLDER_ENTRIES: usize = 10_000;

/// Deepest nesting of folders inside a model folder.
pub const MAX_FOLDER_DEPTH: usize = 8;

/// What a folder's `hangar.json` may do with one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FolderRule {
    /// Any value the definition's own checks accept.
    Free,
    /// At most the operator's `model_repository_limits.<key>`.
    Capped(RepositoryLimit),
    /// A file inside the model's folder: relative, resolved after symlinks, and still
    /// inside.
    Path,
    /// The operator's alone (`model_repository_defaults`, or a configured model): what
    /// runs, where it listens, what it fetches, keys, hub ids, placement and pinning.
    Operator,
}

/// A `model_repository_limits` key: the most a folder may ask of one setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RepositoryLimit {
    /// `replicas`: replicas a folder's model may configure or allow.
    Replicas,
    /// `target_inflight`: requests in flight per replica.
    TargetInflight,
    /// `context_tokens`: context (and cache) size in tokens.
    ContextTokens,
    /// `load_timeout_s`: seconds a load may take.
    LoadTimeoutS,
}

impl RepositoryLimit {
    /// The key under `model_repository_limits`.
    pub fn key(self) -> &'static str {
        match self {
            Self::Replicas => "replicas",
            Self::TargetInflight => "target_inflight",
            Self::ContextTokens => "context_tokens",
            Self::LoadTimeoutS => "load_timeout_s",
        }
    }
}

/// Every field a folder's `hangar.json` may name, with its rule. Anything else is refused.
pub const FOLDER_FIELDS: &[(&str, FolderRule)] = {
    use FolderRule::{Capped, Free, Operator, Path};
    use RepositoryLimit::{ContextTokens, LoadTimeoutS, Replicas, TargetInflight};
    &[
        // Every model.
        ("model_path", Path),
        ("backend", Free),
        ("device", Free),
        ("gpus", Operator),
        ("gpu_split", Operator),
        ("prompt_format", Free),
        ("enabled", Operator),
        ("replicas", Capped(Replicas)),
        ("replica_max", Capped(Replicas)),
        ("target_inflight", Capped(TargetInflight)),
        ("labels", Free),
        ("aliases", Free),
        ("type", Free),
        ("auto_load", Operator),
        ("default_max_tokens", Free),
        ("load_timeout_s", Capped(LoadTimeoutS)),
        ("pinned", Operator),
        ("idle_unload_seconds", Free),
        ("idle_sleep_seconds", Free),
        ("allow_remote_media", Operator),
        ("pass_env", Operator),
        // llama_cpp.
        ("gguf_n_ctx", Capped(ContextTokens)),
        ("gguf_n_gpu_layers", Free),
        ("gguf_flash_attn", Free),
        ("gguf_type_k", Free),
        ("gguf_type_v", Free),
        ("gguf_n_batch", Free),
        ("gguf_n_threads", Free),
        // llama_server.
        ("llama_server_binary_path", Operator),
        ("llama_server_library_path", Operator),
        ("llama_server_mmproj", Path),
        ("llama_server_draft_model", Path),
        ("llama_server_n_gpu_layers", Free),
        ("llama_server_flash_attn", Free),
        ("llama_server_reasoning", Free),
        ("llama_server_extra_args", Operator),
        ("llama_server_backends", Operator),
        ("llama_server_host", Operator),
        ("llama_server_port", Operator),
        ("llama_server_api_key", Operator),
        ("llama_server_n_ctx", Capped(ContextTokens)),
        ("llama_server_image_max_tokens", Free),
        ("llama_server_spec_type", Free),
        ("llama_server_spec_draft_n_max", Free),
        ("llama_server_spec_draft_p_min", Free),
        // vllm and vllm_serve.
        ("vllm_max_model_len", Capped(ContextTokens)),
        ("vllm_kv_cache_dtype", Free),
        ("vllm_kv_cache_memory_bytes", Free),
        ("vllm_gpu_memory_utilization", Free),
        ("vllm_max_pixels", Free),
        ("vllm_mm_processor_kwargs", Operator),
        ("vllm_speculative_method", Free),
        ("vllm_speculative_model", Path),
        ("vllm_num_speculative_tokens", Free),
        ("vllm_tensor_parallel_size", Operator),
        ("vllm_dtype", Free),
        ("vllm_enable_sleep_mode", Free),
        ("vllm_binary_path", Operator),
        ("vllm_model", Operator),
        ("vllm_library_path", Operator),
        ("vllm_env", Operator),
        ("vllm_host", Operator),
        ("vllm_port", Operator),
        ("vllm_api_key", Operator),
        ("vllm_extra_args", Operator),
        // exllamav3, ct2 and the bridge.
        ("exllama_cache_size", Capped(ContextTokens)),
        ("exllama_cache_quant", Free),
        ("exllama_cache_k_bits", Free),
        ("exllama_cache_v_bits", Free),
        ("exllama_max_rq_tokens", Free),
        ("bridge_python", Operator),
        ("ct2_compute_type", Free),
        ("ct2_inter_threads", Free),
        ("ct2_intra_threads", Free),
        // openai_remote.
        ("openai_base_url", Operator),
        ("openai_api_key", Operator),
        ("openai_api_key_env", Operator),
        ("openai_model", Free),
        // The test backend.
        ("stub", Free),
    ]
};

/// The rule of `field`, if a folder may name it at all.
pub fn folder_rule(field: &str) -> Option<FolderRule> {
    FOLDER_FIELDS.iter().find(|(name, _)| *name == field).map(|(_, rule)| *rule)
}

/// Default `model_repository_limits.replicas`.
pub const DEFAULT_FOLDER_REPLICAS: u32 = 1;
/// Default `model_repository_limits.target_inflight`.
pub const DEFAULT_FOLDER_TARGET_INFLIGHT: u32 = 4;
/// Default `model_repository_limits.context_tokens`.
pub const DEFAULT_FOLDER_CONTEXT_TOKENS: u32 = 32_768;

/// `model_repository_limits` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RepositoryLimitsFields {
    /// Most `replicas` (and `replica_max`) a folder's `hangar.json` may set. Default 1.
    replicas: Option<u32>,
    /// Most `target_inflight` a folder may set. Default 4.
    target_inflight: Option<u32>,
    /// Most context a folder may set (`gguf_n_ctx`, `llama_server_n_ctx`,
    /// `vllm_max_model_len`, `exllama_cache_size`), in tokens. Default 32768.
    context_tokens: Option<u32>,
    /// Most `load_timeout_s` a folder may set. Default 300.
    load_timeout_s: Option<u32>,
}

impl Section for RepositoryLimitsFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("replicas", self.replicas, 1);
        p.at_least("target_inflight", self.target_inflight, 1);
        p.at_least("context_tokens", self.context_tokens, 1);
        p.at_least("load_timeout_s", self.load_timeout_s, 1);
    }
}

/// `model_repository_limits`, resolved: the most a folder's `hangar.json` may ask for.
/// `model_repository_defaults` are the operator's and are not held to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepositoryLimits {
    /// Most replicas.
    pub replicas: u32,
    /// Most requests in flight per replica.
    pub target_inflight: u32,
    /// Most context, in tokens.
    pub context_tokens: u32,
    /// Most seconds a load may take.
    pub load_timeout_s: u32,
}

impl Default for RepositoryLimits {
    fn default() -> Self {
        Self::from(RepositoryLimitsFields::default())
    }
}

impl From<RepositoryLimitsFields> for RepositoryLimits {
    fn from(f: RepositoryLimitsFields) -> Self {
        Self {
            replicas: f.replicas.unwrap_or(DEFAULT_FOLDER_REPLICAS),
            target_inflight: f.target_inflight.unwrap_or(DEFAULT_FOLDER_TARGET_INFLIGHT),
            context_tokens: f.context_tokens.unwrap_or(DEFAULT_FOLDER_CONTEXT_TOKENS),
            load_timeout_s: f.load_timeout_s.unwrap_or(crate::DEFAULT_LOAD_TIMEOUT_S),
        }
    }
}

impl RepositoryLimits {
    /// The value of `limit`.
    pub fn get(&self, limit: RepositoryLimit) -> u32 {
        match limit {
            RepositoryLimit::Replicas => self.replicas,
            RepositoryLimit::TargetInflight => self.target_inflight,
            RepositoryLimit::ContextTokens => self.context_tokens,
            RepositoryLimit::LoadTimeoutS => self.load_timeout_s,
        }
    }

    /// The limits as the effective config shows them.
    pub fn to_json(&self) -> Value {
        json!({
            "replicas": self.replicas,
            "target_inflight": self.target_inflight,
            "context_tokens": self.context_tokens,
            "load_timeout_s": self.load_timeout_s,
        })
    }
}

/// Holds a folder's own `hangar.json` fields to [`FOLDER_FIELDS`] and `limits`; path fields
/// are resolved afterwards ([`inside`]). The first field that breaks a rule, in words.
pub(crate) fn check_own(own: &Map<String, Value>, limits: &RepositoryLimits) -> Result<(), String> {
    for (field, value) in own {
        match folder_rule(field) {
            None => {
                return Err(format!(
                    "`{field}` is not a field a repository folder may set (see FOLDER_FIELDS in docs/SECURITY.md)"
                ));
            }
            Some(FolderRule::Operator) => {
                return Err(format!(
                    "`{field}` is the operator's to set (in model_repository_defaults), not a repository folder's"
                ));
            }
            Some(FolderRule::Capped(limit)) => {
                let most = limits.get(limit);
                if value.as_u64().is_some_and(|v| v > u64::from(most)) {
                    return Err(format!(
                        "{field}: {value} is more than model_repository_limits.{} ({most})",
                        limit.key()
                    ));
                }
            }
            Some(FolderRule::Free | FolderRule::Path) => {}
        }
    }
    Ok(())
}

/// The folder's `hangar.json` as an object, if it has one: opened without following a
/// link and without waiting on a pipe, and read only when it is a regular file of at most
/// [`MAX_DEFINITION_BYTES`].
pub(crate) fn read_definition(folder: &Path) -> Result<Option<Map<String, Value>>, String> {
    let path = folder.join(DEFINITION_FILE);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(format!(
                "{DEFINITION_FILE}: is a symbolic link; only a regular file is read"
            ));
        }
        Err(e) => return Err(format!("{DEFINITION_FILE}: cannot read: {e}")),
    };
    let meta = file.metadata().map_err(|e| format!("{DEFINITION_FILE}: cannot read: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{DEFINITION_FILE}: is not a regular file; only a regular file is read"
        ));
    }
    if meta.len() > MAX_DEFINITION_BYTES {
        return Err(format!("{DEFINITION_FILE}: larger than {MAX_DEFINITION_BYTES} bytes"));
    }
    let mut text = String::new();
    let read = file.take(MAX_DEFINITION_BYTES + 1).read_to_string(&mut text);
    read.map_err(|e| format!("{DEFINITION_FILE}: cannot read: {e}"))?;
    if text.len() as u64 > MAX_DEFINITION_BYTES {
        return Err(format!("{DEFINITION_FILE}: larger than {MAX_DEFINITION_BYTES} bytes"));
    }
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(format!("{DEFINITION_FILE}: must be a JSON object (one model definition)")),
        Err(e) => Err(format!("{DEFINITION_FILE}:{}:{}: {e}", e.line(), e.column())),
    }
}

/// `path` (the value of `field` in a `hangar.json`) resolved in `folder` (itself resolved):
/// relative, without `..`, existing, and inside the folder once every link is followed.
pub(crate) fn inside(folder: &Path, field: &str, path: &str) -> Result<PathBuf, String> {
    let relative = Path::new(path);
    let stays =
        relative.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if path.is_empty() || !stays {
        return Err(format!(
            "{DEFINITION_FILE}: {field}: must be a path inside the folder (relative, without `..`), not {path:?}"
        ));
    }
    let resolved = folder.join(relative).canonicalize().map_err(|e| {
        format!("{DEFINITION_FILE}: {field}: cannot resolve {path:?} in the folder: {e}")
    })?;
    if !resolved.starts_with(folder) {
        return Err(format!(
            "{DEFINITION_FILE}: {field}: {path:?} leads out of the folder (to {})",
            resolved.display()
        ));
    }
    Ok(resolved)
}

/// Checks everything in `folder` (resolved) an engine could open: only folders, regular
/// files and links that stay inside; no pipe, socket or device; at most
/// [`MAX_FOLDER_ENTRIES`] entries, [`MAX_FOLDER_DEPTH`] deep.
pub(crate) fn check_tree(folder: &Path) -> Result<(), String> {
    let mut pending = vec![(folder.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = pending.pop() {
        let listing = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot list {}: {e}", shown(folder, &dir)))?;
        for entry in listing {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", shown(folder, &dir)))?;
            seen += 1;
            if seen > MAX_FOLDER_ENTRIES {
                return Err(format!("the folder holds more than {MAX_FOLDER_ENTRIES} entries"));
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(|e| format!("{}: {e}", shown(folder, &path)))?;
            if kind.is_symlink() {
                let target = path.canonicalize();
                match target {
                    Ok(target) if target.starts_with(folder) => {}
                    Ok(target) => {
                        return Err(format!(
                            "{} is a link out of the folder (to {})",
                            shown(folder, &path),
                            target.display()
                        ));
                    }
                    Err(e) => {
                        return Err(format!("{} is a broken link: {e}", shown(folder, &path)));
                    }
                }
            } else if kind.is_dir() {
                if depth + 1 >= MAX_FOLDER_DEPTH {
                    return Err(format!("the folder nests more than {MAX_FOLDER_DEPTH} deep"));
                }
                pending.push((path, depth + 1));
            } else if !kind.is_file() {
                return Err(format!(
                    "{} is not a regular file (a pipe, socket or device)",
                    shown(folder, &path)
                ));
            }
        }
    }
    Ok(())
}

/// `path` as the folder's own (`./weights/m.gguf`), for messages.
fn shown(folder: &Path, path: &Path) -> String {
    match path.strip_prefix(folder) {
        Ok(rest) if rest.as_os_str().is_empty() => "the folder".to_owned(),
        Ok(rest) => format!("`{}`", rest.display()),
        Err(_) => format!("`{}`", path.display()),
    }
}
