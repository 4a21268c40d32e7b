//! The field groups of a model definition, as they appear (flat) in config.
//!
//! Every field is optional here: `None` means "not configured" and the engine's own default
//! applies. A section's fields belong to the backends in [`Section::BACKENDS`]; the
//! validator rejects a field on a model of another backend.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::kinds::{BackendKind, GgmlType, SpecType, Switch};
use crate::secret::Secret;
use crate::validate::Problems;

/// A group of config fields that is parsed, checked and projected together.
pub(crate) trait Section:
    DeserializeOwned + Serialize + JsonSchema + Default + Send + Sync + 'static
{
    /// The backends whose models may set these fields.
    const BACKENDS: &'static [BackendKind];

    /// Range and cross-field checks, run once every field has parsed.
    fn check(&self, problems: &mut Problems<'_>);
}

/// Settings of the in-process llama.cpp backend (`gguf_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct LlamaCppSettings {
    /// Context size in tokens; the model's training context when unset.
    pub gguf_n_ctx: Option<u32>,
    /// Layers to offload to the GPU; -1 offloads all, 0 runs on the CPU.
    pub gguf_n_gpu_layers: Option<i32>,
    /// Flash attention: on, off or auto.
    pub gguf_flash_attn: Option<Switch>,
    /// KV cache type for keys; f16 when unset.
    pub gguf_type_k: Option<GgmlType>,
    /// KV cache type for values; f16 when unset.
    pub gguf_type_v: Option<GgmlType>,
    /// Logical batch size for prompt processing.
    pub gguf_n_batch: Option<u32>,
    /// CPU threads for generation.
    pub gguf_n_threads: Option<u32>,
}

impl Section for LlamaCppSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::LlamaCpp];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("gguf_n_ctx", self.gguf_n_ctx, 1);
        p.at_least("gguf_n_gpu_layers", self.gguf_n_gpu_layers, -1);
        p.at_least("gguf_n_batch", self.gguf_n_batch, 1);
        p.at_least("gguf_n_threads", self.gguf_n_threads, 1);
        // llama.cpp refuses to create such a context ("quantized V cache requires
        // flash_attn"); say so before a load fails (and evicts other models to retry).
        if let Some(v) = self.gguf_type_v.filter(|v| v.is_quantized())
            && self.gguf_flash_attn == Some(Switch::Off)
        {
            p.push(
                "gguf_type_v",
                format!(
                    "a quantized V cache ({}) needs flash attention; set gguf_flash_attn to \"on\" or \"auto\", or gguf_type_v to f16",
                    v.as_str()
                ),
            );
        }
    }
}

/// Settings of the ExLlamaV3 backend (`exllama_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct ExllamaSettings {
    /// KV cache size in tokens; a multiple of 256.
    pub exllama_cache_size: Option<u32>,
    /// KV cache quantization, `"<bits>"` or `"<k_bits>,<v_bits>"` with bits 2..=8; fp16 when
    /// unset.
    pub exllama_cache_quant: Option<String>,
    /// KV cache key bits (2..=8); set together with `exllama_cache_v_bits`.
    pub exllama_cache_k_bits: Option<u8>,
    /// KV cache value bits (2..=8); set together with `exllama_cache_k_bits`.
    pub exllama_cache_v_bits: Option<u8>,
    /// Most tokens one request generates before the generator requeues it behind the
    /// others (ExLlamaV3's `Job(max_rq_tokens)`).
    pub exllama_max_rq_tokens: Option<u32>,
}

/// Parses an `exllama_cache_quant` value into (k_bits, v_bits).
///
/// # Errors
/// A message saying what is wrong with `quant`.
pub fn parse_cache_quant(quant: &str) -> Result<(u8, u8), String> {
    let bits = |s: &str| match s.trim().parse::<u8>() {
        Ok(b @ 2..=8) => Ok(b),
        _ => Err(format!(
            "must be \"<bits>\" or \"<k_bits>,<v_bits>\" with bits from 2 to 8, got {quant:?}"
        )),
    };
    match quant.split_once(',') {
        Some((k, v)) => Ok((bits(k)?, bits(v)?)),
        None => bits(quant).map(|b| (b, b)),
    }
}

impl Section for ExllamaSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::ExLlamaV3];

    fn check(&self, p: &mut Problems<'_>) {
        if let Some(size) = self.exllama_cache_size {
            if size < 256 {
                p.push("exllama_cache_size", "must be >= 256");
            } else if size % 256 != 0 {
                p.push("exllama_cache_size", "must be a multiple of 256");
            }
        }
        if let Some(quant) = &self.exllama_cache_quant
            && let Err(message) = parse_cache_quant(quant)
        {
            p.push("exllama_cache_quant", message);
        }
        p.within("exllama_cache_k_bits", self.exllama_cache_k_bits, 2, 8);
        p.within("exllama_cache_v_bits", self.exllama_cache_v_bits, 2, 8);
        match (self.exllama_cache_k_bits.is_some(), self.exllama_cache_v_bits.is_some()) {
            (true, false) => {
                p.push("exllama_cache_k_bits", "must be set together with exllama_cache_v_bits")
            }
            (false, true) => {
                p.push("exllama_cache_v_bits", "must be set together with exllama_cache_k_bits")
            }
            (true, true) if self.exllama_cache_quant.is_some() => p.push(
                "exllama_cache_quant",
                "cannot be combined with exllama_cache_k_bits / exllama_cache_v_bits",
            ),
            _ => {}
        }
        p.at_least("exllama_max_rq_tokens", self.exllama_max_rq_tokens, 1);
    }
}

/// Settings shared by the backends that run in a Python worker (`ct2`, `exllamav3`, `vllm`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct BridgeSettings {
    /// Python interpreter that runs the worker; `python3` from `PATH` when unset.
    pub bridge_python: Option<String>,
}

impl Section for BridgeSettings {
    const BACKENDS: &'static [BackendKind] =
        &[BackendKind::Ct2, BackendKind::ExLlamaV3, BackendKind::Vllm];

    fn check(&self, p: &mut Problems<'_>) {
        p.non_empty("bridge_python", self.bridge_python.as_deref());
    }
}

/// Engine settings shared by in-process vLLM and `vllm serve` (`vllm_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct VllmSettings {
    /// Context length per request.
    pub vllm_max_model_len: Option<u32>,
    /// KV cache dtype (`auto`, `fp8`, `fp8_e4m3`, `fp8_e5m2`, or any dtype vLLM accepts).
    pub vllm_kv_cache_dtype: Option<String>,
    /// Absolute KV cache size in bytes; overrides `vllm_gpu_memory_utilization` for KV sizing.
    pub vllm_kv_cache_memory_bytes: Option<u64>,
    /// Fraction of GPU memory vLLM may use, in (0, 1].
    pub vllm_gpu_memory_utilization: Option<f64>,
    /// Vision-token budget per image, merged into `vllm_mm_processor_kwargs.max_pixels`.
    pub vllm_max_pixels: Option<u64>,
    /// Extra multimodal processor arguments.
    pub vllm_mm_processor_kwargs: Option<Map<String, Value>>,
    /// Speculative decoding method (`mtp`, `draft_model`, `mlp_speculator`, …).
    pub vllm_speculative_method: Option<String>,
    /// Draft / assistant checkpoint for speculative decoding.
    pub vllm_speculative_model: Option<String>,
    /// Tokens proposed per speculative step.
    pub vllm_num_speculative_tokens: Option<u32>,
    /// Tensor-parallel degree.
    pub vllm_tensor_parallel_size: Option<u32>,
    /// Weight dtype (`auto`, `bfloat16`, …).
    pub vllm_dtype: Option<String>,
    /// vLLM's sleep mode (`--enable-sleep-mode`): the model can sleep (level 1, weights to
    /// host memory; level 2, weights discarded) and wake without a reload. A `vllm_serve`
    /// child then runs in vLLM's development mode, whose routes take no key: it listens on
    /// a Unix socket in a directory only Hangar's user can enter, not on a port
    /// (`docs/SECURITY.md`), so `vllm_host` and `vllm_port` cannot be set with it.
    pub vllm_enable_sleep_mode: Option<bool>,
}

impl VllmSettings {
    /// Whether vLLM's sleep mode is on (`vllm_enable_sleep_mode: true`).
    pub fn sleeps(&self) -> bool {
        self.vllm_enable_sleep_mode == Some(true)
    }
}

impl Section for VllmSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::Vllm, BackendKind::VllmServe];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("vllm_max_model_len", self.vllm_max_model_len, 1);
        p.non_empty("vllm_kv_cache_dtype", self.vllm_kv_cache_dtype.as_deref());
        p.at_least("vllm_kv_cache_memory_bytes", self.vllm_kv_cache_memory_bytes, 1);
        if self.vllm_gpu_memory_utilization.is_some_and(|u| !(u > 0.0 && u <= 1.0)) {
            p.push("vllm_gpu_memory_utilization", "must be > 0 and <= 1");
        }
        p.at_least("vllm_max_pixels", self.vllm_max_pixels, 1);
        p.at_least("vllm_num_speculative_tokens", self.vllm_num_speculative_tokens, 1);
        p.at_least("vllm_tensor_parallel_size", self.vllm_tensor_parallel_size, 1);
    }
}

/// Process settings of `vllm serve` models.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct VllmServeSettings {
    /// The `vllm` executable; `vllm` from `PATH` when unset.
    pub vllm_binary_path: Option<String>,
    /// The model id or path `vllm serve` loads; `model_path` when unset.
    pub vllm_model: Option<String>,
    /// Prepended to the child's `LD_LIBRARY_PATH`.
    pub vllm_library_path: Option<String>,
    /// Extra environment variables for the child.
    pub vllm_env: Option<BTreeMap<String, String>>,
    /// Address the child listens on (127.0.0.1 when only `vllm_port` is set). With neither
    /// set, the child listens on a Unix socket in a private directory: vLLM's key guards
    /// only its `/v1` routes, and no other local user reaches the rest.
    pub vllm_host: Option<String>,
    /// Port the child listens on (a free port when only `vllm_host` is set); see
    /// `vllm_host`.
    pub vllm_port: Option<u16>,
    /// API key the child requires.
    pub vllm_api_key: Option<Secret>,
    /// Extra command-line arguments for `vllm serve`.
    pub vllm_extra_args: Option<Vec<String>>,
}

impl Section for VllmServeSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::VllmServe];

    fn check(&self, p: &mut Problems<'_>) {
        p.non_empty("vllm_binary_path", self.vllm_binary_path.as_deref());
        p.non_empty("vllm_model", self.vllm_model.as_deref());
        p.non_empty("vllm_host", self.vllm_host.as_deref());
        p.at_least("vllm_port", self.vllm_port, 1);
        p.managed_args(
            "vllm_extra_args",
            self.vllm_extra_args.as_deref(),
            &["--port", "--host", "--uds"],
        );
    }
}

/// Settings of llama.cpp's `llama-server` subprocess (`llama_server_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct LlamaServerSettings {
    /// The `llama-server` executable; `llama-server` from `PATH` when unset.
    pub llama_server_binary_path: Option<String>,
    /// Prepended to the child's `LD_LIBRARY_PATH`.
    pub llama_server_library_path: Option<String>,
    /// Multimodal projector file (`--mmproj`).
    pub llama_server_mmproj: Option<String>,
    /// Draft model for speculative decoding (`--model-draft`).
    pub llama_server_draft_model: Option<String>,
    /// Layers to offload to the GPU (`--n-gpu-layers`); -1 offloads all.
    pub llama_server_n_gpu_layers: Option<i32>,
    /// Flash attention (`--flash-attn`).
    pub llama_server_flash_attn: Option<Switch>,
    /// Reasoning (thinking) output.
    pub llama_server_reasoning: Option<Switch>,
    /// Extra native arguments; may not set `--port`, `--host` or `-m`.
    pub llama_server_extra_args: Option<Vec<String>>,
    /// Named `llama-server` builds (e.g. `{"vulkan": "/opt/llama.cpp-vulkan/llama-server"}`);
    /// a Lemonade-style load's `llamacpp_backend` picks one as the binary for that load.
    pub llama_server_backends: Option<BTreeMap<String, String>>,
    /// Address the child listens on; 127.0.0.1 when unset.
    pub llama_server_host: Option<String>,
    /// Port the child listens on; a free port when unset.
    pub llama_server_port: Option<u16>,
    /// API key the child requires.
    pub llama_server_api_key: Option<Secret>,
    /// Context size (`-c`).
    pub llama_server_n_ctx: Option<u32>,
    /// Vision token budget per image (`--image-max-tokens`).
    pub llama_server_image_max_tokens: Option<u32>,
    /// Speculative decoding mode; only `draft-mtp`.
    pub llama_server_spec_type: Option<SpecType>,
    /// Maximum draft tokens per step (`--spec-draft-n-max`), 1..=6.
    pub llama_server_spec_draft_n_max: Option<u32>,
    /// Minimum draft probability (`--spec-draft-p-min`), 0.0..=1.0.
    pub llama_server_spec_draft_p_min: Option<f64>,
}

/// Arguments Hangar sets itself on `llama-server` and that extra args may not repeat.
pub const LLAMA_SERVER_MANAGED_ARGS: &[&str] = &["--port", "--host", "-m", "--model"];

impl Section for LlamaServerSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::LlamaServer];

    fn check(&self, p: &mut Problems<'_>) {
        p.non_empty("llama_server_binary_path", self.llama_server_binary_path.as_deref());
        p.non_empty("llama_server_host", self.llama_server_host.as_deref());
        p.at_least("llama_server_port", self.llama_server_port, 1);
        p.at_least("llama_server_n_gpu_layers", self.llama_server_n_gpu_layers, -1);
        p.at_least("llama_server_n_ctx", self.llama_server_n_ctx, 1);
        p.at_least("llama_server_image_max_tokens", self.llama_server_image_max_tokens, 1);
        p.within("llama_server_spec_draft_n_max", self.llama_server_spec_draft_n_max, 1, 6);
        if self.llama_server_spec_draft_p_min.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            p.push("llama_server_spec_draft_p_min", "must be between 0.0 and 1.0");
        }
        for (name, path) in self.llama_server_backends.iter().flatten() {
            if name.trim().is_empty() || path.trim().is_empty() {
                p.nested("llama_server_backends")
                    .push(name, "names and binary paths must not be empty");
            }
        }
        p.managed_args(
            "llama_server_extra_args",
            self.llama_server_extra_args.as_deref(),
            LLAMA_SERVER_MANAGED_ARGS,
        );
    }
}

/// Settings of the CTranslate2 backend (`ct2_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Ct2Settings {
    /// Compute type (`int8`, `float16`, `int8_float16`, …).
    pub ct2_compute_type: Option<String>,
    /// Parallel translators / generators.
    pub ct2_inter_threads: Option<u32>,
    /// Threads per translator / generator.
    pub ct2_intra_threads: Option<u32>,
}

impl Section for Ct2Settings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::Ct2];

    fn check(&self, p: &mut Problems<'_>) {
        p.non_empty("ct2_compute_type", self.ct2_compute_type.as_deref());
        p.at_least("ct2_inter_threads", self.ct2_inter_threads, 1);
        p.at_least("ct2_intra_threads", self.ct2_intra_threads, 1);
    }
}

/// Settings of a remote OpenAI-compatible model (`openai_*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct OpenAiRemoteSettings {
    /// Base URL of the remote API, e.g. `https://api.example.com/v1`. Required.
    pub openai_base_url: Option<String>,
    /// API key sent as a bearer token.
    pub openai_api_key: Option<Secret>,
    /// Name of an environment variable holding the API key.
    pub openai_api_key_env: Option<String>,
    /// The model name on the remote server; the Hangar model name when unset.
    pub openai_model: Option<String>,
}

impl Section for OpenAiRemoteSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::OpenaiRemote];

    fn check(&self, p: &mut Problems<'_>) {
        match self.openai_base_url.as_deref() {
            None => p.push("openai_base_url", "required for backend openai_remote"),
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                p.push("openai_base_url", "must start with http:// or https://")
            }
            Some(_) => {}
        }
        if self.openai_api_key.is_some() && self.openai_api_key_env.is_some() {
            p.push("openai_api_key_env", "cannot be combined with openai_api_key");
        }
        p.non_empty("openai_api_key_env", self.openai_api_key_env.as_deref());
        p.non_empty("openai_model", self.openai_model.as_deref());
    }
}

/// The `stub` section: knobs of the deterministic test backend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct StubSection {
    /// Simulated behaviour of the stub runtime.
    pub(crate) stub: Option<StubSettings>,
}

impl Section for StubSection {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::Stub];

    fn check(&self, p: &mut Problems<'_>) {
        if let Some(stub) = &self.stub {
            stub.check(&mut p.nested("stub"));
        }
    }
}

/// Simulated behaviour of a `stub` model, used by tests and demos.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StubSettings {
    /// Simulated load time in milliseconds.
    pub load_delay_ms: Option<u64>,
    /// Simulated unload time in milliseconds.
    pub unload_delay_ms: Option<u64>,
    /// Delay before each generated token, in milliseconds.
    pub token_latency_ms: Option<u64>,
    /// When set, every load fails with this message.
    pub fail_load: Option<String>,
    /// When true, every load fails as "model file not found".
    pub not_found: Option<bool>,
    /// The runtime crashes while serving request number N (1-based) after it loads (a
    /// generation after its first word).
    pub crash_after_requests: Option<u64>,
    /// Parallel sequences the stub runtime supports; clamps `target_inflight`.
    pub max_parallel_sequences: Option<u32>,
    /// Requests the scheduler hands one stub replica beyond `target_inflight`, as for an
    /// engine with its own queue (default 0).
    pub dispatch_ahead: Option<u32>,
    /// Whether the stub accepts request-level `thinking` (`enabled` / `disabled`); with
    /// `enabled` its reply opens with a `<think>…</think>` part, as a reasoning model's does.
    pub thinking: Option<bool>,
    /// Fixed reply text; when unset, the reply is derived from the prompt.
    pub reply: Option<String>,
    /// Whether the stub can sleep (at level `context`): asleep, it gives its pretend GPU
    /// memory back and serves nothing until woken.
    pub sleeps: Option<bool>,
    /// Once woken, the stub replies this instead (an engine that wakes wrong).
    pub reply_after_wake: Option<String>,
}

impl Section for StubSettings {
    const BACKENDS: &'static [BackendKind] = &[BackendKind::Stub];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("crash_after_requests", self.crash_after_requests, 1);
        p.at_least("max_parallel_sequences", self.max_parallel_sequences, 1);
    }
}
