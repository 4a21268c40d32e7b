//! The sampler chain of a generation: the request's constraint as a llama.cpp grammar first
//! (so only the tokens it allows remain), then greedy, or top-k / top-p / temperature and a
//! seeded draw.

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

/// How the next token is drawn: greedy without a positive temperature, else top-k, top-p,
/// temperature and a seeded (or, without a seed, random) draw.
fn draw(p: &SamplingParams) -> LlamaSampler {
    match p.temperature {
        Some(t) if t > 0.0 => {
            let mut chain = Vec::new();
            if let Some(k) = p.top_k.filter(|&k| k > 0) {
                chain.push(LlamaSampler::top_k(i32::try_from(k).unwrap_or(i32::MAX)));
            }
            if let Some(top_p) = p.top_p.filter(|&p| p > 0.0 && p < 1.0) {
                chain.push(LlamaSampler::top_p(top_p, 1));
            }
            chain.push(LlamaSampler::temp(t));
            // LLAMA_DEFAULT_SEED (0xFFFFFFFF) picks a random seed.
            let seed = p.seed.map_or(u32::MAX, |s| (s ^ (s >> 32)) as u32);
            chain.push(LlamaSampler::dist(seed));
            LlamaSampler::chain_simple(chain)
        }
        _ => LlamaSampler::greedy(),
    }
}
