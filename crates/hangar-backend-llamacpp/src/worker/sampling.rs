//! The sampler chain of a generation: the request's constraint as a llama.cpp grammar first
//! (so only the tokens it allows remain), then greedy (`temperature: 0`), or top-k / top-p /
//! min-p / temperature and a seeded draw.
//!
//! Defaults are `llama-server`'s ([`DEFAULTS`]): a request that sets no sampling field is
//! sampled at temperature 0.8 with top-k 40, top-p 0.95 and min-p 0.05, as the same GGUF
//! would be through `llama-server` (and through a `llama_server` model in Hangar, whose
//! requests are forwarded untouched). Not OpenAI's temperature 1 with no truncation: on small
//! GGUF models that draws from the long tail, and llama.cpp users expect llama.cpp's
//! defaults. Not greedy: a small model decoded greedily falls into repetition loops.

use hangar_backend::{GenerateRequest, RuntimeError, SamplingParams};
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;

use super::failed;
use crate::prompt::TOOL_CALL_OPEN;
use crate::structured::{self, Constraint};

/// The sampler chain of `request` on `model`, constrained by `constraint`.
///
/// # Errors
/// [`RuntimeError::Failed`] when llama.cpp rejects the constraint's grammar.
pub(super) fn sampler(
    model: &LlamaModel,
    request: &GenerateRequest,
    constraint: &Constraint,
) -> Result<LlamaSampler, RuntimeError> {
    let grammar = match constraint {
        Constraint::Free => None,
        Constraint::Json { grammar } | Constraint::Tools { grammar, lazy: false, .. } => {
            Some(LlamaSampler::grammar(model, grammar, structured::ROOT))
        }
        Constraint::Tools { grammar, lazy: true, .. } => Some(LlamaSampler::grammar_lazy(
            model,
            grammar,
            structured::ROOT,
            [TOOL_CALL_OPEN],
            &[],
        )),
    };
    let draw = draw(&request.params);
    match grammar {
        None => Ok(draw),
        Some(Ok(grammar)) => Ok(LlamaSampler::chain_simple([grammar, draw])),
        Some(Err(e)) => Err(failed(format!("llama.cpp rejected the grammar: {e}"))),
    }
}

/// `llama-server`'s sampling defaults (`common_params_sampling` of the llama.cpp Hangar
/// links), used for every field a request leaves unset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Defaults {
    /// `temperature`: 0.8.
    pub(crate) temperature: f32,
    /// `top_k`: 40 (0 turns it off).
    pub(crate) top_k: u32,
    /// `top_p`: 0.95 (1 turns it off).
    pub(crate) top_p: f32,
    /// `min_p`: 0.05 (not a request field: always on when sampling).
    pub(crate) min_p: f32,
}

/// The defaults in use: `llama-server`'s.
pub(crate) const DEFAULTS: Defaults =
    Defaults { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05 };

/// How the next token is drawn: greedy at temperature 0 (or below), else top-k, top-p, min-p,
/// temperature and a seeded (or, without a seed, random) draw, in `llama-server`'s order,
/// each unset field taking its [`DEFAULTS`] value.
fn draw(p: &SamplingParams) -> LlamaSampler {
    let t = p.temperature.unwrap_or(DEFAULTS.temperature);
    if t <= 0.0 {
        return LlamaSampler::greedy();
    }
    let mut chain = Vec::new();
    let k = p.top_k.unwrap_or(DEFAULTS.top_k);
    if k > 0 {
        chain.push(LlamaSampler::top_k(i32::try_from(k).unwrap_or(i32::MAX)));
    }
    let top_p = p.top_p.unwrap_or(DEFAULTS.top_p);
    if top_p > 0.0 && top_p < 1.0 {
        chain.push(LlamaSampler::top_p(top_p, 1));
    }
    chain.push(LlamaSampler::min_p(DEFAULTS.min_p, 1));
    chain.push(LlamaSampler::temp(t));
    // LLAMA_DEFAULT_SEED (0xFFFFFFFF) picks a random seed.
    let seed = p.seed.map_or(u32::MAX, |s| (s ^ (s >> 32)) as u32);
    chain.push(LlamaSampler::dist(seed));
    LlamaSampler::chain_simple(chain)
}
