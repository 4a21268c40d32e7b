//! Sampling parameters shared by chat completions and completions, and the checks serde
//! cannot make.

use hangar_runtime::engine::SamplingParams;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Stop sequences: one string or a list of strings.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum StopSequences {
    /// One stop sequence.
    One(String),
    /// Several stop sequences.
    Many(Vec<String>),
}

/// Streaming options.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the token usage (and `choices: []`) before `[DONE]`.
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

/// Sampling fields of chat completions and completions (flattened into their bodies).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub(crate) struct SamplingFields {
    /// Sampling temperature, 0 to 2.
    #[schemars(range(min = 0, max = 2))]
    pub(crate) temperature: Option<f64>,
    /// Nucleus sampling mass, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    pub(crate) top_p: Option<f64>,
    /// Top-k sampling (extension); 0 disables it.
    pub(crate) top_k: Option<u32>,
    /// Seed for reproducible sampling.
    pub(crate) seed: Option<u64>,
    /// Stop sequences: a string or a list of strings.
    pub(crate) stop: Option<StopSequences>,
    /// Number of choices; only 1 is supported.
    #[schemars(range(min = 1, max = 1))]
    pub(crate) n: Option<u32>,
}

impl SamplingFields {
    /// The backend's parameters, checked. `max_tokens` comes with the name the request used.
    ///
    /// # Errors
    /// 400 `invalid_request` for values out of range and `n` other than 1.
    pub(crate) fn params(
        self,
        max_tokens: (Option<u32>, &str),
    ) -> Result<SamplingParams, ApiError> {
        check_n(self.n)?;
        let mut params = checked(max_tokens, self.temperature, self.top_p)?;
        params.top_k = self.top_k;
        params.seed = self.seed;
        params.stop = match self.stop {
            None => Vec::new(),
            Some(StopSequences::One(s)) => vec![s],
            Some(StopSequences::Many(v)) => v,
        };
        Ok(params)
    }
}

/// `max_tokens`, `temperature` and `top_p`, checked (the Responses API has only these).
///
/// # Errors
/// 400 `invalid_request` for values out of range.
pub(crate) fn checked(
    (max_tokens, max_name): (Option<u32>, &str),
    temperature: Option<f64>,
    top_p: Option<f64>,
) -> Result<SamplingParams, ApiError> {
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(format!("`{max_name}` must be at least 1")));
    }
    if let Some(t) = temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(ApiError::bad_request(format!(
            "`temperature` must be between 0 and 2, got {t}"
        )));
    }
    if let Some(p) = top_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(ApiError::bad_request(format!("`top_p` must be between 0 and 1, got {p}")));
    }
    Ok(SamplingParams {
        max_tokens,
        temperature: temperature.map(|t| t as f32),
        top_p: top_p.map(|p| p as f32),
        ..SamplingParams::default()
    })
}

fn check_n(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_request(format!(
            "`n` must be 1 (got {n}); only one choice is supported"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_checks_ranges() {
        let fields = |t, p| SamplingFields { temperature: t, top_p: p, ..Default::default() };
        assert!(fields(None, None).params((Some(0), "max_tokens")).is_err());
        assert!(fields(Some(2.5), None).params((None, "max_tokens")).is_err());
        assert!(fields(None, Some(1.5)).params((None, "max_tokens")).is_err());
        let two = SamplingFields { n: Some(2), ..Default::default() };
        assert!(two.params((None, "max_tokens")).unwrap_err().message.contains("`n` must be 1"));
        let p = SamplingFields {
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            seed: Some(7),
            stop: Some(StopSequences::One("x".into())),
            n: Some(1),
        }
        .params((Some(4), "max_tokens"))
        .unwrap();
        assert_eq!(
            (p.max_tokens, p.top_k, p.seed, p.stop),
            (Some(4), Some(40), Some(7), vec!["x".to_owned()])
        );
    }
}
