//! Valid UTF-8 out of byte tokens: the [`Utf8Guard`] masks the tokens that would spell invalid
//! UTF-8 before each draw, and [`take_utf8`] releases text only once its characters are
//! complete.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

/// Keeps generated text valid UTF-8. Byte-fallback tokens (`<0x80>` …) can spell invalid
/// sequences, and llama.cpp's grammars accept bytes leniently, so invalid output would turn
/// into U+FFFD (and, say, overrun a schema's `maxLength`). Before each draw the guard removes
/// the tokens that would make the text invalid: at a character boundary those whose bytes
/// cannot start valid text; inside a multi-byte character everything except the
/// continuations that keep it valid.
pub(super) struct Utf8Guard {
    /// Tokens whose bytes are no valid UTF-8 (prefix) on their own.
    invalid_alone: Vec<LlamaToken>,
    /// Tokens whose bytes start with a continuation byte, with those bytes.
    continuations: Vec<(LlamaToken, Vec<u8>)>,
}

/// Whether `bytes` is valid UTF-8, possibly ending inside a character.
fn valid_prefix(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

impl Utf8Guard {
    pub(super) fn new(model: &LlamaModel) -> Self {
        let vocab = model.vocab();
        let mut guard = Self { invalid_alone: Vec::new(), continuations: Vec::new() };
        for id in 0..vocab.n_tokens() {
            let token = LlamaToken::new(id);
            let bytes = vocab.token_to_piece(token, false, None);
            if !valid_prefix(&bytes) {
                guard.invalid_alone.push(token);
            }
            if bytes.first().is_some_and(|b| (0x80..0xC0).contains(b)) {
                guard.continuations.push((token, bytes));
            }
        }
        guard
    }

    /// Masks the candidates that would make `pending` (the bytes of an unfinished character,
    /// usually none) invalid. Leaves everything as is when nothing valid would remain.
    pub(super) fn mask(&self, candidates: &mut LlamaTokenDataArray, pending: &[u8]) {
        let data = &mut candidates.data;
        let len = data.len();
        let index = |t: LlamaToken| usize::try_from(t.0).ok().filter(|&i| i < len);
        if pending.is_empty() {
            for &token in &self.invalid_alone {
                if let Some(i) = index(token) {
                    data[i].set_logit(f32::NEG_INFINITY);
                }
            }
            return;
        }
        let allowed: Vec<usize> = self
            .continuations
            .iter()
            .filter(|(_, bytes)| valid_prefix(&[pending, bytes.as_slice()].concat()))
            .filter_map(|&(token, _)| index(token))
            .collect();
        if allowed.is_empty() {
            return;
        }
        let kept: Vec<f32> = allowed.iter().map(|&i| data[i].logit()).collect();
        data.iter_mut().for_each(|d| d.set_logit(f32::NEG_INFINITY));
        for (i, logit) in allowed.into_iter().zip(kept) {
            data[i].set_logit(logit);
        }
    }
}

/// Takes the longest valid UTF-8 prefix out of `bytes` (a token can end mid-character).
pub(super) fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => s.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes that no continuation can fix: replace them.
        Err(_) => {
            let s = String::from_utf8_lossy(bytes).into_owned();
            bytes.clear();
            return s;
        }
    };
    let rest = bytes.split_off(valid);
    String::from_utf8(std::mem::replace(bytes, rest)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_emitted_only_when_complete() {
        let mut bytes = vec![b'a', 0xC3];
        assert_eq!(take_utf8(&mut bytes), "a");
        bytes.push(0xA9);
        assert_eq!(take_utf8(&mut bytes), "é");
        assert!(bytes.is_empty());
    }
}
