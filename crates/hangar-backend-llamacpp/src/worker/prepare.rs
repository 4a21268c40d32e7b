//! A generation's prompt tokens, prepared before the request reaches its worker: the text
//! rendered (the configured prompt format, or the GGUF's embedded template) and tokenized,
//! and checked against one sequence's context.
//!
//! This runs on a blocking thread of the runtime, not on the worker: rendering and
//! tokenizing only read the shared weights (llama.cpp's vocabulary is immutable once loaded;
//! `llama-server` tokenizes on its HTTP threads while its main loop decodes), and a prompt of
//! megabytes (the body limit is 8 MiB) takes long enough to stall every sequence of the
//! replica's batch if the batch thread did it. A prompt whose bytes alone prove it cannot fit
//! is refused without being tokenized at all ([`PieceBound`]).

use hangar_backend::{GenerateRequest, Prompt, RuntimeError};
use hangar_config::PromptFormat;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::SharedModel;
use crate::prompt::{self, RenderRequest};

/// A generation's prompt, tokenized and known to fit one sequence's context.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The whole prompt: the request's, then the tokens of its `resume` text.
    pub(super) prompt: Vec<LlamaToken>,
    /// Tokens of the request's own prompt (the usage's `prompt_tokens`).
    pub(super) own_prompt: usize,
}

impl Prepared {
    /// Tokens of the request's own prompt: what its usage reports as `prompt_tokens`.
    pub(crate) fn own_prompt_tokens(&self) -> usize {
        self.own_prompt
    }
}

/// The most bytes of prompt text one token can stand for, when the vocabulary makes that a
/// bound: then a text of `b` bytes is at least `b / bound` tokens, and one too long for the
/// context is refused before it is tokenized.
///
/// It holds for byte-level vocabularies (SentencePiece and GPT-2 BPE), where the tokens'
/// pieces spell the text back byte for byte (SentencePiece's `▁` is one space), so no token
/// stands for more text than its piece, control tokens included (their text is their piece
/// when parsed as special). It does not hold, and there is no bound, for vocabularies that
/// drop or fold text (WordPiece and Unigram normalize whitespace) or that have a token which
/// swallows the whitespace next to it (`lstrip` / `rstrip`, as Phi-3's special tokens do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PieceBound(Option<usize>);

impl PieceBound {
    /// Reads the bound off `model`'s vocabulary (once per load: one pass over the tokens).
    pub(crate) fn new(model: &LlamaModel) -> Self {
        use llama_cpp_2::token_type::LlamaTokenAttr::{LStrip, RStrip};
        // The GGUF's tokenizer name, as llama.cpp reads it: `llama` is SentencePiece, `gpt2`
        // byte-level BPE. (`LlamaVocab::vocab_type` panics on the other kinds.)
        let tokenizer = model.meta_val_str("tokenizer.ggml.model").unwrap_or_default();
        if !matches!(tokenizer.as_str(), "llama" | "gpt2") {
            return Self(None);
        }
        let vocab = model.vocab();
        let mut longest = 0;
        for token in vocab.tokens() {
            let attrs = vocab.attr(token);
            if attrs.contains(LStrip) || attrs.contains(RStrip) {
                return Self(None);
            }
            longest = longest.max(vocab.token_to_piece(token, true, None).len());
        }
        Self((longest > 0).then_some(longest))
    }

    /// The fewest tokens `bytes` of text can be, when the vocabulary bounds it.
    fn min_tokens(self, bytes: usize) -> Option<usize> {
        self.0.map(|longest| bytes.div_ceil(longest))
    }
}

/// The prompt text: raw prompts as they are, chat through `format` ([`prompt::render`]), or
/// for `auto` through the GGUF's own template ([`AutoTemplate`]).
fn prompt_text(
    shared: &SharedModel,
    format: PromptFormat,
    request: &GenerateRequest,
) -> Result<String, RuntimeError> {
    let tools = request.tools.as_ref().map_or(&[][..], |t| t.tools.as_slice());
    if let (PromptFormat::Auto, Prompt::Chat(messages)) = (format, &request.prompt) {
        if messages.is_empty() {
            let message = prompt::PromptError::EmptyMessages.to_string();
            return Err(RuntimeError::InvalidRequest { message });
        }
        return shared.auto.render(&shared.model, messages, tools);
    }
    let prepared;
    let prompt = match &request.prompt {
        Prompt::Chat(messages)
            if !tools.is_empty() || messages.iter().any(|m| !m.tool_calls.is_empty()) =>
        {
            prepared = Prompt::Chat(prompt::with_tools(messages, tools));
            &prepared
        }
        prompt => prompt,
    };
    let req = RenderRequest {
        prompt,
        thinking: request.thinking,
        translation: request.translation.as_ref(),
    };
    match prompt::render(format, &req) {
        Ok(Some(text)) => Ok(text),
        Ok(None) => Err(RuntimeError::Failed { message: "auto is rendered above".into() }),
        Err(e) => Err(RuntimeError::InvalidRequest { message: e.to_string() }),
    }
}

/// Tokenizes `text` (special tokens parsed); `add_special` adds BOS (and what else the vocab
/// wants).
pub(super) fn tokenize(model: &LlamaModel, text: &str, add_special: bool) -> Vec<LlamaToken> {
    let vocab = model.vocab();
    let mut tokens = vocab.tokenize(text.as_bytes(), add_special, true);
    // A template that spells out BOS plus add_special gives two.
    if tokens.len() >= 2 && tokens[0] == vocab.bos() && tokens[1] == vocab.bos() {
        tokens.remove(0);
    }
    tokens
}

/// The refusal of a prompt of `size` (`N tokens`) in a context of `n_ctx` tokens.
fn too_long(size: impl std::fmt::Display, n_ctx: usize) -> RuntimeError {
    RuntimeError::InvalidRequest { message: format!("prompt is {size}, the context holds {n_ctx}") }
}

/// `request`'s prompt for a sequence whose context holds `n_ctx` tokens.
///
/// # Errors
/// [`RuntimeError::InvalidRequest`] for a prompt that does not render, is empty, or does not
/// fit the context (`prompt is N tokens, the context holds M`; `at least N` when its length
/// alone refused it, untokenized).
pub(crate) fn prepare(
    shared: &SharedModel,
    format: PromptFormat,
    n_ctx: usize,
    request: &GenerateRequest,
) -> Result<Prepared, RuntimeError> {
    let (model, bound) = (&shared.model, shared.bound);
    let text = prompt_text(shared, format, request)?;
    let resume = request.resume.as_deref().filter(|r| !r.is_empty()).unwrap_or_default();
    let bytes = text.len().saturating_add(resume.len());
    // Each part is tokenized on its own, so each is at least its own share.
    let floor = bound.min_tokens(text.len()).zip(bound.min_tokens(resume.len()));
    if let Some(least) = floor.map(|(a, b)| a + b).filter(|&least| least >= n_ctx) {
        return Err(too_long(format_args!("at least {least} tokens ({bytes} bytes)"), n_ctx));
    }
    let mut prompt = tokenize(model, &text, true);
    if prompt.is_empty() {
        return Err(RuntimeError::InvalidRequest { message: "empty prompt".to_owned() });
    }
    // A resumed generation: what it already produced is decoded as prompt and counted as
    // completion, so the answer goes on as if never interrupted.
    let own_prompt = prompt.len();
    if !resume.is_empty() {
        prompt.extend(tokenize(model, resume, false));
    }
    if prompt.len() >= n_ctx {
        return Err(too_long(format_args!("{} tokens", prompt.len()), n_ctx));
    }
    Ok(Prepared { prompt, own_prompt })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_counts_whole_tokens_of_the_longest_piece() {
        let bound = PieceBound(Some(4));
        assert_eq!([0, 1, 4, 5, 8, 9].map(|b| bound.min_tokens(b)), [0, 1, 1, 2, 2, 3].map(Some));
        assert_eq!(PieceBound(None).min_tokens(1 << 23), None);
    }

    /// On the tiny chat fixture (SentencePiece, ChatML's special tokens), no text tokenizes
    /// to fewer tokens than the bound says: a refusal by length never refuses a prompt that
    /// would fit.
    #[test]
    fn the_bound_never_exceeds_the_real_token_count_on_the_fixture() {
        use llama_cpp_2::llama_backend::LlamaBackend;
        use llama_cpp_2::model::params::LlamaModelParams;
        let llama = LlamaBackend::init().expect("llama.cpp initialises");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf");
        let params = LlamaModelParams::default().with_n_gpu_layers(0);
        let model = LlamaModel::load_from_file(&llama, path, &params).expect("fixture loads");
        let bound = PieceBound::new(&model);
        assert!(bound.0.is_some(), "a SentencePiece vocabulary has a bound");
        // WordPiece folds whitespace away: no bound (and no panic reading it).
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-embed.gguf");
        let bert = LlamaModel::load_from_file(&llama, path, &params).expect("fixture loads");
        assert_eq!(PieceBound::new(&bert), PieceBound(None));
        let texts = [
            "hello world".to_owned(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".repeat(20),
            "<|im_start|><|im_end|>".repeat(50),
            " ".repeat(300),
            "\n\n\t\t  ".repeat(40),
            "héllo wörld — 你好，世界 😀🚀".repeat(20),
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".repeat(10),
            "<s></s><unk>".repeat(30),
        ];
        for text in texts {
            for add_special in [true, false] {
                let tokens = tokenize(&model, &text, add_special).len();
                let least = bound.min_tokens(text.len()).unwrap();
                assert!(least <= tokens, "{least} > {tokens} tokens for {text:?}");
            }
        }
    }
}
