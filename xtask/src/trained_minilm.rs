//! all-MiniLM-L6-v2 (sentence-transformers' `BertModel` + mean pooling) to an F32 GGUF, the
//! way llama.cpp's `convert_hf_to_gguf.py` converts a BERT model (which needs torch and
//! modules the wheel does not ship): the same tensor names, hyper-parameters, pooling type and
//! "phantom space" WordPiece vocabulary (`##x` → `x`, `x` → `▁x`, `[X]` kept).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value as Json;

use crate::fixtures::ALIGNMENT;
use crate::fixtures::gguf::{Gguf, Value};

/// `llama_token_type`: NORMAL and CONTROL.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// The GGUF bytes of the model in `dir` (`model.safetensors`, `vocab.txt`, `config.json`,
/// `1_Pooling/config.json`).
pub(crate) fn convert(dir: &Path) -> Result<Vec<u8>> {
    let config = read_json(&dir.join("config.json"))?;
    let pooling = read_json(&dir.join("1_Pooling/config.json"))?;
    let hp = |key: &str| -> Result<u32> {
        config[key]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .with_context(|| format!("config.json: no {key}"))
    };
    let pooling_type = if pooling["pooling_mode_mean_tokens"] == true {
        1
    } else if pooling["pooling_mode_cls_token"] == true {
        2
    } else {
        bail!("1_Pooling/config.json: neither mean nor CLS pooling");
    };
    let vocab_text = fs::read_to_string(dir.join("vocab.txt")).context("cannot read vocab.txt")?;
    let words: Vec<&str> = vocab_text.lines().collect();
    if words.len() != hp("vocab_size")? as usize {
        bail!("vocab.txt has {} tokens, config.json says {}", words.len(), hp("vocab_size")?);
    }
    let id_of = |piece: &str| -> Result<u32> {
        let id = words
            .iter()
            .position(|w| *w == piece)
            .with_context(|| format!("no {piece} in vocab.txt"))?;
        Ok(u32::try_from(id)?)
    };

    let mut g = Gguf::default();
    g.str("general.architecture", "bert");
    g.str("general.name", "all-MiniLM-L6-v2");
    g.str("general.license", "apache-2.0");
    g.u32("general.alignment", ALIGNMENT as u32);
    g.u32("general.file_type", 0); // ALL_F32
    g.u32("bert.context_length", hp("max_position_embeddings")?);
    g.u32("bert.embedding_length", hp("hidden_size")?);
    g.u32("bert.block_count", hp("num_hidden_layers")?);
    g.u32("bert.feed_forward_length", hp("intermediate_size")?);
    g.u32("bert.attention.head_count", hp("num_attention_heads")?);
    let eps = config["layer_norm_eps"].as_f64().context("config.json: no layer_norm_eps")?;
    g.f32("bert.attention.layer_norm_epsilon", eps as f32);
    g.bool("bert.attention.causal", false);
    g.u32("bert.pooling_type", pooling_type);

    let special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let pieces = words.iter().map(|w| phantom(w)).collect();
    let types = words.iter().map(|w| if special.contains(w) { CONTROL } else { NORMAL }).collect();
    g.str("tokenizer.ggml.model", "bert");
    g.u32("tokenizer.ggml.token_type_count", hp("type_vocab_size")?);
    g.kv("tokenizer.ggml.tokens", Value::StrArray(pieces));
    g.kv("tokenizer.ggml.scores", Value::F32Array(vec![0.0; words.len()]));
    g.kv("tokenizer.ggml.token_type", Value::I32Array(types));
    g.u32("tokenizer.ggml.bos_token_id", id_of("[CLS]")?);
    g.u32("tokenizer.ggml.unknown_token_id", id_of("[UNK]")?);
    g.u32("tokenizer.ggml.seperator_token_id", id_of("[SEP]")?);
    g.u32("tokenizer.ggml.padding_token_id", id_of("[PAD]")?);
    g.u32("tokenizer.ggml.cls_token_id", id_of("[CLS]")?);
    g.u32("tokenizer.ggml.mask_token_id", id_of("[MASK]")?);
    g.bool("tokenizer.ggml.add_bos_token", true);
    g.bool("tokenizer.ggml.add_sep_token", true);

    let tensors = safetensors(&dir.join("model.safetensors"))?;
    for (name, (shape, data)) in tensors {
        let Some(gguf_name) = gguf_name(&name) else {
            if matches!(name.as_str(), "embeddings.position_ids") || name.starts_with("pooler.") {
                continue;
            }
            bail!("model.safetensors: no GGUF name for tensor {name}");
        };
        // GGUF lists dimensions innermost first: PyTorch's shape reversed, same bytes.
        let dims: Vec<u64> = shape.iter().rev().copied().collect();
        g.tensor(&gguf_name, &dims, data);
    }
    Ok(g.to_bytes())
}

/// llama.cpp's WordPiece spelling of a `vocab.txt` entry.
fn phantom(word: &str) -> String {
    if word.starts_with('[') && word.ends_with(']') {
        word.to_owned()
    } else if let Some(rest) = word.strip_prefix("##") {
        rest.to_owned()
    } else {
        format!("\u{2581}{word}")
    }
}

/// The GGUF name of a Hugging Face BERT tensor (`None` for those llama.cpp does not use).
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "embeddings.word_embeddings.weight" => Some("token_embd.weight"),
        "embeddings.token_type_embeddings.weight" => Some("token_types.weight"),
        "embeddings.position_embeddings.weight" => Some("position_embd.weight"),
        "embeddings.LayerNorm.weight" => Some("token_embd_norm.weight"),
        "embeddings.LayerNorm.bias" => Some("token_embd_norm.bias"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_owned());
    }
    let rest = hf.strip_prefix("encoder.layer.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let part = match module {
        "attention.self.query" => "attn_q",
        "attention.self.key" => "attn_k",
        "attention.self.value" => "attn_v",
        "attention.output.dense" => "attn_output",
        "attention.output.LayerNorm" => "attn_output_norm",
        "intermediate.dense" => "ffn_up",
        "output.dense" => "ffn_down",
        "output.LayerNorm" => "layer_output_norm",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{part}.{kind}"))
}

/// Tensors by name: (PyTorch shape, values).
type Tensors = BTreeMap<String, (Vec<u64>, Vec<f32>)>;

/// A safetensors file's F32 tensors by name; other types are skipped.
fn safetensors(path: &Path) -> Result<Tensors> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let len = bytes.get(..8).context("safetensors: no header length")?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into()?))?;
    let header = bytes.get(8..8 + len).context("safetensors: header past the end")?;
    let header: BTreeMap<String, Json> = serde_json::from_slice(header)?;
    let data = &bytes[8 + len..];
    let mut tensors = BTreeMap::new();
    for (name, info) in header {
        if name == "__metadata__" || info["dtype"] != "F32" {
            continue;
        }
        let shape: Vec<u64> = serde_json::from_value(info["shape"].clone())?;
        let [start, end]: [usize; 2] = serde_json::from_value(info["data_offsets"].clone())?;
        let raw =
            data.get(start..end).with_context(|| format!("safetensors: {name} past the end"))?;
        if raw.len() as u64 != shape.iter().product::<u64>() * 4 {
            bail!("safetensors: {name} has {} bytes for shape {shape:?}", raw.len());
        }
        let values =
            raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        tensors.insert(name, (shape, values));
    }
    Ok(tensors)
}

fn read_json(path: &Path) -> Result<Json> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_entries_are_spelled_as_llama_cpp_reads_wordpiece() {
        assert_eq!(phantom("[CLS]"), "[CLS]");
        assert_eq!(phantom("##ing"), "ing");
        assert_eq!(phantom("paris"), "\u{2581}paris");
    }

    #[test]
    fn bert_tensors_get_llama_cpps_names_and_the_pooler_none() {
        let name = |hf: &str| gguf_name(hf);
        assert_eq!(name("embeddings.word_embeddings.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(
            name("encoder.layer.5.attention.output.LayerNorm.bias").as_deref(),
            Some("blk.5.attn_output_norm.bias")
        );
        assert_eq!(
            name("encoder.layer.0.output.dense.weight").as_deref(),
            Some("blk.0.ffn_down.weight")
        );
        assert_eq!(
            name("encoder.layer.0.intermediate.dense.bias").as_deref(),
            Some("blk.0.ffn_up.bias")
        );
        assert_eq!(name("pooler.dense.weight"), None);
        assert_eq!(name("encoder.layer.x.output.dense.weight"), None);
    }
}
