//! From a model's `gguf_*` settings to llama.cpp's model and context parameters.
//!
//! Everything in [`LlamaCppSettings`] maps onto a parameter `llama-cpp-2` exposes:
//! `gguf_n_gpu_layers` (model), `gguf_n_ctx`, `gguf_n_batch` (also the micro-batch for
//! embedding and reranking models, whose inputs must fit one micro-batch),
//! `gguf_n_threads` (generation and batch threads; without it the replica's share of the
//! machine's cores, [`crate::threads`]), `gguf_flash_attn`, `gguf_type_k`, `gguf_type_v`
//! (context). The context holds `n_seq_max` sequences (the model's `target_inflight`) in one
//! unified KV cache of `n_seq_max × gguf_n_ctx` cells; each sequence may use `gguf_n_ctx` of
//! them, so the cache never runs out.

use std::num::NonZeroU32;

use hangar_backend::LoadError;
use hangar_config::{GgmlType, LlamaCppSettings, ModelType, Switch};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::model::params::{LlamaModelParams, LlamaSplitMode};

/// `LLAMA_FLASH_ATTN_TYPE_*` from `llama.h`.
const FLASH_ATTN_AUTO: i32 = -1;
const FLASH_ATTN_DISABLED: i32 = 0;
const FLASH_ATTN_ENABLED: i32 = 1;

/// Applies the model-level settings, and the placement's `devices` (llama.cpp's indices;
/// empty: its default, every GPU): one GPU holds the whole model (`split_mode` none,
/// `main_gpu` 0 of the list), several split it by layers.
///
/// # Errors
/// [`LoadError::Refused`] when llama.cpp refuses the device list.
pub(crate) fn model_params(
    settings: &LlamaCppSettings,
    devices: &[usize],
    params: LlamaModelParams,
) -> Result<LlamaModelParams, LoadError> {
    let params = match settings.gguf_n_gpu_layers {
        // -1 (and anything negative) offloads every layer.
        Some(n) => params.with_n_gpu_layers(u32::try_from(n).unwrap_or(u32::MAX)),
        None => params,
    };
    if devices.is_empty() {
        return Ok(params);
    }
    let params = params.with_devices(devices).map_err(|e| LoadError::Refused {
        message: format!("llama.cpp refused the devices {devices:?}: {e}"),
    })?;
    Ok(if devices.len() == 1 {
        params.with_split_mode(LlamaSplitMode::None).with_main_gpu(0)
    } else {
        params.with_split_mode(LlamaSplitMode::Layer)
    })
}

/// What a replica decides beyond the settings: the whole context, its sequences, threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContextPlan {
    /// Context of all sequences together (one sequence's context times `n_seq`).
    pub(crate) n_ctx: u32,
    /// Sequences the context serves at once, in one unified KV cache: a batch of several
    /// sequences is one graph over it (per-sequence streams measured about half as fast at
    /// 4 sequences on the tiny model, `docs/benchmarks.md`).
    pub(crate) n_seq: u32,
    /// Generation and batch threads.
    pub(crate) threads: u32,
}

/// The context parameters for a model of `model_type` with `settings`, as `plan` sizes it.
pub(crate) fn context_params(
    settings: &LlamaCppSettings,
    model_type: ModelType,
    plan: ContextPlan,
) -> LlamaContextParams {
    let threads = i32::try_from(plan.threads).unwrap_or(i32::MAX);
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(plan.n_ctx))
        .with_n_seq_max(plan.n_seq)
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    if let Some(n_batch) = settings.gguf_n_batch {
        params = params.with_n_batch(n_batch);
    }
    if let Some(switch) = settings.gguf_flash_attn {
        params = params.with_flash_attention_policy(match switch {
            Switch::On => FLASH_ATTN_ENABLED,
            Switch::Off => FLASH_ATTN_DISABLED,
            Switch::Auto => FLASH_ATTN_AUTO,
        });
    }
    if let Some(t) = settings.gguf_type_k {
        params = params.with_type_k(kv_cache_type(t));
    }
    if let Some(t) = settings.gguf_type_v {
        params = params.with_type_v(kv_cache_type(t));
    }
    match model_type {
        ModelType::Llm => params,
        ModelType::Embedding | ModelType::Reranking => {
            // Non-causal encoders need a whole input in one micro-batch.
            let n_batch = params.n_batch();
            params = params.with_embeddings(true).with_n_ubatch(n_batch);
            if model_type == ModelType::Reranking {
                params = params.with_pooling_type(LlamaPoolingType::Rank);
            }
            params
        }
    }
}

/// The KV cache type llama.cpp uses for a config's [`GgmlType`].
pub(crate) fn kv_cache_type(t: GgmlType) -> KvCacheType {
    match t {
        GgmlType::F32 => KvCacheType::F32,
        GgmlType::F16 => KvCacheType::F16,
        GgmlType::Bf16 => KvCacheType::BF16,
        GgmlType::Q8_0 => KvCacheType::Q8_0,
        GgmlType::Q4_0 => KvCacheType::Q4_0,
        GgmlType::Q4_1 => KvCacheType::Q4_1,
        GgmlType::Iq4Nl => KvCacheType::IQ4_NL,
        GgmlType::Q5_0 => KvCacheType::Q5_0,
        GgmlType::Q5_1 => KvCacheType::Q5_1,
    }
}
