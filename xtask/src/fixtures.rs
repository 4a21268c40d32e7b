//! `cargo xtask fixtures`: deterministic tiny random-weight GGUF models that llama.cpp loads
//! for real.
//!
//! Three files go to `fixtures/models/`:
//!
//! - `tiny-llama.gguf`: a `llama`-architecture chat model (2 layers, n_embd 64, 2 heads of
//!   32 dims, 1 KV head, n_ff 128) with a SentencePiece (`llama`) vocabulary of `<unk>`, `<s>`, `</s>`, the
//!   256 byte-fallback tokens, word pieces, and the ChatML control tokens `<|im_start|>` /
//!   `<|im_end|>`, plus an embedded ChatML `tokenizer.chat_template`.
//! - `tiny-embed.gguf`: a `bert`-architecture encoder with a WordPiece (`bert`) vocabulary and
//!   `bert.pooling_type` = 1 (mean), for the embeddings path.
//! - `tiny-rerank.gguf`: the same encoder plus the classifier head (`cls.*`, `cls.output.*`)
//!   and `bert.pooling_type` = 4 (rank), for the reranking path.
//!
//! Everything is derived from fixed seeds through a SplitMix64 generator and only IEEE
//! additions and multiplications (no `ln`/`cos`, whose last bit may differ between C
//! libraries), so the same command writes byte-identical files on every machine.
//!
//! The GGUF writer is the format of `ggml/include/gguf.h` (version 3): the magic `GGUF`,
//! version, tensor count, key/value count, the key/values, the tensor infos (name, dims,
//! ggml type, offset), padding to `general.alignment`, then each tensor's data padded to the
//! alignment. All integers are little-endian.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

pub(crate) mod gguf;

use gguf::*;

/// The alignment of the tensor data (and of every tensor's offset), written as
/// `general.alignment`; 32 is also GGUF's default.
pub(crate) const ALIGNMENT: usize = 32;

/// The files `cargo xtask fixtures` writes, by name.
pub(crate) const FILES: [&str; 3] = ["tiny-llama.gguf", "tiny-embed.gguf", "tiny-rerank.gguf"];

/// Writes every fixture into `<root>/fixtures/models`.
pub(crate) fn run(root: &Path) -> Result<()> {
    let dir = root.join("fixtures").join("models");
    for (name, len) in write_all(&dir)? {
        eprintln!("wrote {} ({len} bytes)", dir.join(name).display());
    }
    Ok(())
}

/// Writes every fixture into `dir` (created when missing); returns each file's name and size.
pub(crate) fn write_all(dir: &Path) -> Result<Vec<(&'static str, usize)>> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, bytes) in generate() {
        let path = dir.join(name);
        fs::write(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
        written.push((name, bytes.len()));
    }
    Ok(written)
}

/// The bytes of every fixture, in the order of [`FILES`].
pub(crate) fn generate() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (FILES[0], tiny_llama().to_bytes()),
        (FILES[1], tiny_bert(Head::Embedding).to_bytes()),
        (FILES[2], tiny_bert(Head::Rerank).to_bytes()),
    ]
}

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers
// ---------------------------------------------------------------------------------------------

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits (exact: an integer times a power of two).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Approximately N(0, 1): the Irwin–Hall sum of 12 uniforms minus 6. Only additions, so
    /// the result is bit-for-bit the same everywhere (unlike Box–Muller's `ln` and `cos`).
    fn next_normal(&mut self) -> f64 {
        let mut sum = 0.0;
        for _ in 0..12 {
            sum += self.next_f64();
        }
        sum - 6.0
    }
}

/// A seed per tensor: FNV-1a of the file's seed label and the tensor name, so adding or
/// reordering tensors never changes the others' values.
fn seed_for(file: &str, tensor: &str) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    for byte in file.bytes().chain([0u8]).chain(tensor.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    hash
}

// ---------------------------------------------------------------------------------------------
// Tensor contents
// ---------------------------------------------------------------------------------------------

/// Standard deviation of the random weights (the usual transformer init).
const WEIGHT_STD: f64 = 0.02;

/// Builds tensors of one file, each from its own seed.
struct Weights<'a> {
    file: &'a str,
}

impl Weights<'_> {
    /// N(0, 0.02²) values.
    fn random(&self, name: &str, dims: &[u64]) -> Vec<f32> {
        let mut rng = SplitMix64(seed_for(self.file, name));
        let n: u64 = dims.iter().product();
        (0..n).map(|_| (rng.next_normal() * WEIGHT_STD) as f32).collect()
    }

    fn fill(dims: &[u64], v: f32) -> Vec<f32> {
        vec![v; dims.iter().product::<u64>() as usize]
    }

    fn add_random(&self, g: &mut Gguf, name: &str, dims: &[u64]) {
        let data = self.random(name, dims);
        g.tensor(name, dims, data);
    }

    /// A normalisation weight: all ones.
    fn add_ones(g: &mut Gguf, name: &str, dims: &[u64]) {
        g.tensor(name, dims, Self::fill(dims, 1.0));
    }

    /// A bias: all zeros.
    fn add_zeros(g: &mut Gguf, name: &str, dims: &[u64]) {
        g.tensor(name, dims, Self::fill(dims, 0.0));
    }
}

// ---------------------------------------------------------------------------------------------
// tiny-llama.gguf
// ---------------------------------------------------------------------------------------------

/// The ChatML template (as in Qwen2/Hermes models); llama.cpp's built-in template detection
/// recognises it by `<|im_start|>`, and its Jinja engine runs it as is.
pub(crate) const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// SentencePiece token types (`llama_token_type`).
mod token_type {
    pub(super) const NORMAL: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const CONTROL: i32 = 3;
    pub(super) const BYTE: i32 = 6;
}

/// The SentencePiece vocabulary: (piece, score, type). `▁` (U+2581) marks a word start.
///
/// llama.cpp's SPM tokenizer starts from single characters and merges adjacent pieces whose
/// concatenation is in the vocabulary, highest score first, so every multi-character piece
/// here is reachable through pieces that are also in the vocabulary; anything else falls back
/// to the byte tokens.
fn spm_vocab() -> Vec<(String, f32, i32)> {
    let mut vocab: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, token_type::UNKNOWN),
        ("<s>".into(), 0.0, token_type::CONTROL),
        ("</s>".into(), 0.0, token_type::CONTROL),
    ];
    for b in 0..=255u8 {
        vocab.push((format!("<0x{b:02X}>"), 0.0, token_type::BYTE));
    }
    let mut pieces: Vec<String> = Vec::new();
    // Single characters: the word-start marker, letters, digits, punctuation.
    pieces.push("\u{2581}".into());
    pieces.extend(('a'..='z').map(String::from));
    pieces.extend(('0'..='9').map(String::from));
    pieces.extend([".", ",", "!", "?", ":", "'", "-"].map(String::from));
    // Word-start letters.
    pieces.extend(('a'..='z').map(|c| format!("\u{2581}{c}")));
    // Common bigrams, then words (with the word-start marker), each the concatenation of two
    // pieces listed before it.
    let bigrams = ["th", "he", "in", "er", "an", "on", "re", "at", "ll", "lo", "or", "ld"];
    pieces.extend(bigrams.map(String::from));
    let words = [
        "th", "the", "an", "and", "is", "to", "of", "in", "he", "hel", "hell", "hello", "wor",
        "world", "yo", "you", "it", "wh", "what", "on", "one",
    ];
    pieces.extend(words.map(|w| format!("\u{2581}{w}")));
    // Scores: later (longer) pieces win merges over earlier ones, like SentencePiece's log
    // probabilities of frequent merges.
    let n = pieces.len();
    for (i, p) in pieces.into_iter().enumerate() {
        let score = -((n - i) as f32);
        vocab.push((p, score, token_type::NORMAL));
    }
    vocab.push(("<|im_start|>".into(), 0.0, token_type::CONTROL));
    vocab.push(("<|im_end|>".into(), 0.0, token_type::CONTROL));
    vocab
}

fn tiny_llama() -> Gguf {
    const FILE: &str = "tiny-llama";
    const N_EMBD: u64 = 64;
    // Heads of 32 dims: llama.cpp refuses a quantized KV cache (q8_0, q4_0: blocks of 32)
    // unless the head size is a multiple of the block size, and Hangar offers those presets.
    const N_HEAD: u64 = 2;
    const N_HEAD_KV: u64 = 1;
    const N_FF: u64 = 128;
    const N_LAYER: u64 = 2;
    const HEAD_DIM: u64 = N_EMBD / N_HEAD;

    let vocab = spm_vocab();
    let n_vocab = vocab.len() as u64;
    let id_of = |piece: &str| vocab.iter().position(|(p, _, _)| p == piece).expect("piece") as u32;

    let mut g = Gguf::default();
    g.str("general.architecture", "llama");
    g.str("general.name", "Hangar tiny llama (random weights)");
    g.str(
        "general.description",
        "Test fixture written by `cargo xtask fixtures`; gibberish output.",
    );
    g.u32("general.alignment", ALIGNMENT as u32);
    g.u32("general.file_type", 0); // ALL_F32
    g.u32("llama.context_length", 2048);
    g.u32("llama.embedding_length", N_EMBD as u32);
    g.u32("llama.block_count", N_LAYER as u32);
    g.u32("llama.feed_forward_length", N_FF as u32);
    g.u32("llama.attention.head_count", N_HEAD as u32);
    g.u32("llama.attention.head_count_kv", N_HEAD_KV as u32);
    g.u32("llama.rope.dimension_count", HEAD_DIM as u32);
    g.f32("llama.rope.freq_base", 10000.0);
    g.f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    g.u32("llama.vocab_size", n_vocab as u32);

    g.str("tokenizer.ggml.model", "llama");
    g.str("tokenizer.ggml.pre", "default");
    g.kv("tokenizer.ggml.tokens", Value::StrArray(vocab.iter().map(|v| v.0.clone()).collect()));
    g.kv("tokenizer.ggml.scores", Value::F32Array(vocab.iter().map(|v| v.1).collect()));
    g.kv("tokenizer.ggml.token_type", Value::I32Array(vocab.iter().map(|v| v.2).collect()));
    g.u32("tokenizer.ggml.bos_token_id", id_of("<s>"));
    g.u32("tokenizer.ggml.eos_token_id", id_of("</s>"));
    g.u32("tokenizer.ggml.eot_token_id", id_of("<|im_end|>"));
    g.u32("tokenizer.ggml.unknown_token_id", id_of("<unk>"));
    g.bool("tokenizer.ggml.add_bos_token", true);
    g.bool("tokenizer.ggml.add_eos_token", false);
    g.str("tokenizer.chat_template", CHATML_TEMPLATE);

    let w = Weights { file: FILE };
    w.add_random(&mut g, "token_embd.weight", &[N_EMBD, n_vocab]);
    for i in 0..N_LAYER {
        let blk = |t: &str| format!("blk.{i}.{t}");
        Weights::add_ones(&mut g, &blk("attn_norm.weight"), &[N_EMBD]);
        w.add_random(&mut g, &blk("attn_q.weight"), &[N_EMBD, HEAD_DIM * N_HEAD]);
        w.add_random(&mut g, &blk("attn_k.weight"), &[N_EMBD, HEAD_DIM * N_HEAD_KV]);
        w.add_random(&mut g, &blk("attn_v.weight"), &[N_EMBD, HEAD_DIM * N_HEAD_KV]);
        w.add_random(&mut g, &blk("attn_output.weight"), &[HEAD_DIM * N_HEAD, N_EMBD]);
        Weights::add_ones(&mut g, &blk("ffn_norm.weight"), &[N_EMBD]);
        w.add_random(&mut g, &blk("ffn_gate.weight"), &[N_EMBD, N_FF]);
        w.add_random(&mut g, &blk("ffn_down.weight"), &[N_FF, N_EMBD]);
        w.add_random(&mut g, &blk("ffn_up.weight"), &[N_EMBD, N_FF]);
    }
    Weights::add_ones(&mut g, "output_norm.weight", &[N_EMBD]);
    w.add_random(&mut g, "output.weight", &[N_EMBD, n_vocab]);
    g
}

// ---------------------------------------------------------------------------------------------
// tiny-embed.gguf / tiny-rerank.gguf
// ---------------------------------------------------------------------------------------------

/// Which head the BERT encoder gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Mean pooling of the last hidden states (`pooling_type` 1).
    Embedding,
    /// The sequence-classification head on the `[CLS]` state (`pooling_type` 4, rank).
    Rerank,
}

/// The WordPiece vocabulary as llama.cpp stores it: specials first, then word-start pieces
/// with the `▁` prefix (HF's plain tokens) and continuation pieces without it (HF's `##x`).
fn wpm_vocab() -> Vec<(String, i32)> {
    let mut vocab: Vec<(String, i32)> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .into_iter()
        .map(|s| (s.to_owned(), token_type::CONTROL))
        .collect();
    let mut normal = |s: String| vocab.push((s, token_type::NORMAL));
    for c in ('a'..='z').chain('0'..='9') {
        normal(format!("\u{2581}{c}"));
    }
    for c in ('a'..='z').chain('0'..='9') {
        normal(c.to_string());
    }
    for p in [".", ",", "!", "?", ":", ";", "'", "\"", "-", "(", ")"] {
        normal(format!("\u{2581}{p}"));
    }
    for w in [
        "the", "a", "an", "and", "of", "to", "in", "is", "it", "that", "for", "on", "with", "as",
        "was", "he", "she", "they", "we", "you", "this", "be", "at", "by", "from", "or", "hello",
        "world", "cat", "dog", "paris", "france", "capital", "city", "what", "which", "where",
        "who", "how", "model", "query", "document", "answer", "question", "search", "rank",
    ] {
        normal(format!("\u{2581}{w}"));
    }
    for suffix in ["s", "ed", "ing", "er", "est", "ly", "tion"] {
        normal(suffix.to_owned());
    }
    // Keep the first occurrence of a piece listed twice (`▁a` is a letter and a word).
    let mut seen = std::collections::HashSet::new();
    vocab.retain(|(piece, _)| seen.insert(piece.clone()));
    vocab
}

fn tiny_bert(head: Head) -> Gguf {
    const N_EMBD: u64 = 64;
    const N_HEAD: u64 = 2;
    const N_FF: u64 = 128;
    const N_LAYER: u64 = 2;
    const N_CTX: u64 = 512;
    const N_TOKEN_TYPES: u64 = 2;

    let (file, name, pooling) = match head {
        Head::Embedding => ("tiny-embed", "Hangar tiny embedding BERT (random weights)", 1),
        Head::Rerank => ("tiny-rerank", "Hangar tiny reranking BERT (random weights)", 4),
    };
    let vocab = wpm_vocab();
    let n_vocab = vocab.len() as u64;
    let id_of = |piece: &str| vocab.iter().position(|(p, _)| p == piece).expect("piece") as u32;

    let mut g = Gguf::default();
    g.str("general.architecture", "bert");
    g.str("general.name", name);
    g.str("general.description", "Test fixture written by `cargo xtask fixtures`; random output.");
    g.u32("general.alignment", ALIGNMENT as u32);
    g.u32("general.file_type", 0); // ALL_F32
    g.u32("bert.context_length", N_CTX as u32);
    g.u32("bert.embedding_length", N_EMBD as u32);
    g.u32("bert.block_count", N_LAYER as u32);
    g.u32("bert.feed_forward_length", N_FF as u32);
    g.u32("bert.attention.head_count", N_HEAD as u32);
    g.f32("bert.attention.layer_norm_epsilon", 1e-12);
    g.bool("bert.attention.causal", false);
    g.u32("bert.pooling_type", pooling);
    if head == Head::Rerank {
        g.kv("bert.classifier.output_labels", Value::StrArray(vec!["LABEL_0".into()]));
    }

    g.str("tokenizer.ggml.model", "bert");
    g.u32("tokenizer.ggml.token_type_count", N_TOKEN_TYPES as u32);
    g.kv("tokenizer.ggml.tokens", Value::StrArray(vocab.iter().map(|v| v.0.clone()).collect()));
    g.kv("tokenizer.ggml.scores", Value::F32Array(vec![0.0; vocab.len()]));
    g.kv("tokenizer.ggml.token_type", Value::I32Array(vocab.iter().map(|v| v.1).collect()));
    g.u32("tokenizer.ggml.bos_token_id", id_of("[CLS]"));
    g.u32("tokenizer.ggml.unknown_token_id", id_of("[UNK]"));
    g.u32("tokenizer.ggml.seperator_token_id", id_of("[SEP]"));
    g.u32("tokenizer.ggml.padding_token_id", id_of("[PAD]"));
    g.u32("tokenizer.ggml.cls_token_id", id_of("[CLS]"));
    g.u32("tokenizer.ggml.mask_token_id", id_of("[MASK]"));
    g.bool("tokenizer.ggml.add_bos_token", true);
    g.bool("tokenizer.ggml.add_sep_token", true);

    let w = Weights { file };
    w.add_random(&mut g, "token_embd.weight", &[N_EMBD, n_vocab]);
    w.add_random(&mut g, "token_types.weight", &[N_EMBD, N_TOKEN_TYPES]);
    w.add_random(&mut g, "position_embd.weight", &[N_EMBD, N_CTX]);
    Weights::add_ones(&mut g, "token_embd_norm.weight", &[N_EMBD]);
    Weights::add_zeros(&mut g, "token_embd_norm.bias", &[N_EMBD]);
    for i in 0..N_LAYER {
        let blk = |t: &str| format!("blk.{i}.{t}");
        for proj in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            w.add_random(&mut g, &blk(&format!("{proj}.weight")), &[N_EMBD, N_EMBD]);
            Weights::add_zeros(&mut g, &blk(&format!("{proj}.bias")), &[N_EMBD]);
        }
        Weights::add_ones(&mut g, &blk("attn_output_norm.weight"), &[N_EMBD]);
        Weights::add_zeros(&mut g, &blk("attn_output_norm.bias"), &[N_EMBD]);
        w.add_random(&mut g, &blk("ffn_up.weight"), &[N_EMBD, N_FF]);
        Weights::add_zeros(&mut g, &blk("ffn_up.bias"), &[N_FF]);
        w.add_random(&mut g, &blk("ffn_down.weight"), &[N_FF, N_EMBD]);
        Weights::add_zeros(&mut g, &blk("ffn_down.bias"), &[N_EMBD]);
        Weights::add_ones(&mut g, &blk("layer_output_norm.weight"), &[N_EMBD]);
        Weights::add_zeros(&mut g, &blk("layer_output_norm.bias"), &[N_EMBD]);
    }
    if head == Head::Rerank {
        // llama.cpp's rank pooling: tanh(cls · h_[CLS] + cls_b), then cls.output → 1 score.
        w.add_random(&mut g, "cls.weight", &[N_EMBD, N_EMBD]);
        Weights::add_zeros(&mut g, "cls.bias", &[N_EMBD]);
        w.add_random(&mut g, "cls.output.weight", &[N_EMBD, 1]);
        Weights::add_zeros(&mut g, "cls.output.bias", &[1]);
    }
    g
}

/// Writes `fixtures/models/tiny-ct2`: a tiny random LLaMA-like CTranslate2 decoder with its
/// tokenizer, by `xtask/fixtures/tiny_ct2.py` under the bridge virtualenv's `python`
/// (numpy, ctranslate2 and tokenizers only; fixed seed).
pub(crate) fn ct2(root: &Path, python: &Path) -> Result<()> {
    let out = root.join("fixtures/models/tiny-ct2");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(root.join("xtask/fixtures/tiny_ct2.py")).arg(&out);
    crate::run(cmd)?;
    println!("wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests;
