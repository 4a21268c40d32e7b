//! The attention shape of a GGUF model, read from its header's metadata: what the size of
//! its KV cache depends on ([`gguf_shape`], [`GgufShape::kv_cache_bytes`]).
//!
//! The keys and their defaults are llama.cpp's (`llama_model_base::load_hparams` in the
//! llama.cpp of llama-cpp-sys-2 0.1.161). The key/value pairs are read twice, once for
//! `general.architecture` and once for the keys under it, so that only those keys' values are
//! ever held in memory, whatever order the file lists them in; tensor infos and data are not
//! read.

use std::collections::BTreeMap;
use std::path::Path;

use crate::WeightsError;
use crate::gguf::{self, Reader, value_type};

/// llama.cpp's `LLAMA_MAX_LAYERS`: it refuses a larger `block_count`, and it bounds every
/// per-layer array read here.
const MAX_LAYERS: u64 = 512;

/// The choices of llama.cpp's `--cache-type-k` / `--cache-type-v` (`kv_cache_types` in
/// `common/arg.cpp`), spelled as it matches them: `ggml_type_name`, case-sensitive.
const CACHE_TYPES: [&str; 9] =
    ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"];

/// The keys read, after `<arch>.`.
const BLOCK_COUNT: &str = "block_count";
const CONTEXT_LENGTH: &str = "context_length";
const EMBEDDING_LENGTH: &str = "embedding_length";
const HEAD_COUNT: &str = "attention.head_count";
const HEAD_COUNT_KV: &str = "attention.head_count_kv";
const KEY_LENGTH: &str = "attention.key_length";
const VALUE_LENGTH: &str = "attention.value_length";
const SLIDING_WINDOW: &str = "attention.sliding_window";
const KEYS: [&str; 8] = [
    BLOCK_COUNT,
    CONTEXT_LENGTH,
    EMBEDDING_LENGTH,
    HEAD_COUNT,
    HEAD_COUNT_KV,
    KEY_LENGTH,
    VALUE_LENGTH,
    SLIDING_WINDOW,
];

/// What a GGUF model's KV cache depends on, read from its header's metadata by
/// [`gguf_shape`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufShape {
    /// `general.architecture`, the prefix of the other keys (`llama`, `qwen2`, `gemma3`).
    pub architecture: String,
    /// `<arch>.block_count`: the number of layers, 1 to 512 (llama.cpp's limit).
    pub block_count: u32,
    /// `<arch>.context_length`: the context the model was trained with, when stated.
    pub context_length: Option<u64>,
    /// The KV heads of each layer, `block_count` entries: `<arch>.attention.head_count_kv`,
    /// one value for every layer or an array of one per layer; where that is absent,
    /// `<arch>.attention.head_count` read the same way (no grouped-query attention).
    pub head_count_kv: Vec<u32>,
    /// The elements of one head's key: `<arch>.attention.key_length`, else
    /// `<arch>.embedding_length / <arch>.attention.head_count` (the first layer's head
    /// count, rounded down, as llama.cpp derives it).
    pub key_length: u32,
    /// The elements of one head's value: `<arch>.attention.value_length`, else the same
    /// default as [`key_length`](Self::key_length).
    pub value_length: u32,
    /// `<arch>.attention.sliding_window` in tokens, when stated. Informational:
    /// [`kv_cache_bytes`](Self::kv_cache_bytes) does not use it.
    pub sliding_window: Option<u64>,
}

impl GgufShape {
    /// Bytes of a KV cache of `n_ctx` tokens with keys of ggml type `type_k` and values of
    /// `type_v`; `None` when either is not a name llama.cpp's `--cache-type-k` takes (`f32`,
    /// `f16`, `bf16`, `q8_0`, `q4_0`, `q4_1`, `iq4_nl`, `q5_0`, `q5_1`, lower case).
    ///
    /// llama.cpp's cache holds, for every token and layer `l`, a row of
    /// `head_count_kv[l] × key_length` key elements and one of `head_count_kv[l] ×
    /// value_length` value elements. A row of a quantized type takes whole blocks (`q8_0`:
    /// 34 bytes a block of 32 elements), a partial block rounded up. Exact integer
    /// arithmetic, saturating at `u64::MAX`.
    ///
    /// The figure is an upper bound for sliding-window models (llama.cpp may keep a smaller
    /// cache for their window layers), and it is the cache only: compute buffers, recurrent
    /// state and llama.cpp's rounding of the context size are not counted. Encoder-only
    /// models (`bert`) get no KV cache from llama.cpp at all, and caches of another layout
    /// (MLA's compressed one, SWA layers with their own `key_length_swa`) are not modelled;
    /// that is the caller's call.
    pub fn kv_cache_bytes(&self, n_ctx: u64, type_k: &str, type_v: &str) -> Option<u64> {
        let (k, v) = (cache_type(type_k)?, cache_type(type_v)?);
        let row = |ty: gguf::GgmlType, heads: u32, length: u32| {
            let elements = u64::from(heads) * u64::from(length);
            elements.div_ceil(ty.block).saturating_mul(ty.size)
        };
        let layer =
            |heads| row(k, heads, self.key_length).saturating_add(row(v, heads, self.value_length));
        let per_token =
            self.head_count_kv.iter().fold(0u64, |sum, &heads| sum.saturating_add(layer(heads)));
        Some(per_token.saturating_mul(n_ctx))
    }
}

/// The ggml type of a cache type name, if llama.cpp accepts it for the KV cache.
fn cache_type(name: &str) -> Option<gguf::GgmlType> {
    if !CACHE_TYPES.contains(&name) {
        return None;
    }
    gguf::ggml_type_named(&name.to_ascii_uppercase())
}

/// Reads the attention shape of the GGUF model at `path` from its metadata only, never
/// its tensor data. Integer keys may have any integer value type (`uint8` to `int64`).
///
/// # Errors
///
/// [`WeightsError::Io`] when the file cannot be read. [`WeightsError::Format`] when it is
/// not GGUF v2/v3, its key/value pairs are malformed or truncated, `general.architecture`,
/// `<arch>.block_count` or both head counts are missing, a key repeats, a key holds a
/// negative, out-of-range or non-integer value, a per-layer array's length differs from
/// `block_count`, or the head size is neither stated nor derivable; the message names the key.
pub fn gguf_shape(path: &Path) -> Result<GgufShape, WeightsError> {
    let architecture = read_architecture(path)?;
    let prefix = format!("{architecture}.");
    let values = read_values(path, &prefix)?;
    let error = |message: String| WeightsError::format(path, message);
    let name = |key: &str| format!("{prefix}{key}");

    let block_count = match values.get(BLOCK_COUNT) {
        None => return Err(error(format!("missing {}", name(BLOCK_COUNT)))),
        Some(value) => value.single(&name(BLOCK_COUNT)).map_err(&error)?,
    };
    let Some(block_count) =
        u32::try_from(block_count).ok().filter(|&n| (1..=MAX_LAYERS).contains(&u64::from(n)))
    else {
        return Err(error(format!(
            "{} is {block_count}; llama.cpp supports 1 to {MAX_LAYERS} layers",
            name(BLOCK_COUNT)
        )));
    };
    let layers = block_count as usize;
    let per_layer = |key: &str| -> Result<Option<Vec<u32>>, WeightsError> {
        values.get(key).map(|v| v.per_layer(&name(key), layers)).transpose().map_err(&error)
    };
    let single = |key: &str| -> Result<Option<u64>, WeightsError> {
        values.get(key).map(|v| v.single(&name(key))).transpose().map_err(&error)
    };
    let single_u32 = |key: &str| -> Result<Option<u32>, WeightsError> {
        let to_u32 = |v| u32::try_from(v).map_err(|_| error(too_large(&name(key), v)));
        single(key)?.map(to_u32).transpose()
    };

    let head_count = per_layer(HEAD_COUNT)?;
    let head_count_kv = match (per_layer(HEAD_COUNT_KV)?, &head_count) {
        (Some(kv), _) => kv,
        (None, Some(heads)) => heads.clone(),
        (None, None) => {
            return Err(error(format!("missing {} and {}", name(HEAD_COUNT_KV), name(HEAD_COUNT))));
        }
    };
    // llama.cpp: `n_embd / n_head()`, the first layer's head count.
    let derived = match (single_u32(EMBEDDING_LENGTH)?, head_count.as_ref().map(|h| h[0])) {
        (Some(embedding), Some(heads)) if heads > 0 => Some(embedding / heads),
        _ => None,
    };
    let head_length = |key: &str| {
        single_u32(key)?.or(derived).ok_or_else(|| {
            error(format!(
                "missing {}, and it cannot be derived without {} and a non-zero {}",
                name(key),
                name(EMBEDDING_LENGTH),
                name(HEAD_COUNT)
            ))
        })
    };

    Ok(GgufShape {
        block_count,
        context_length: single(CONTEXT_LENGTH)?,
        head_count_kv,
        key_length: head_length(KEY_LENGTH)?,
        value_length: head_length(VALUE_LENGTH)?,
        sliding_window: single(SLIDING_WINDOW)?,
        architecture,
    })
}

/// `general.architecture`, from a first pass over the key/value pairs.
fn read_architecture(path: &Path) -> Result<String, WeightsError> {
    let (mut r, counts) = gguf::open(path)?;
    for _ in 0..counts.kvs {
        let (key, ty) = gguf::read_key(&mut r)?;
        if key != b"general.architecture" {
            gguf::skip_value(&mut r, ty)?;
            continue;
        }
        if ty != value_type::STRING {
            return Err(r.error(format!(
                "general.architecture has value type {}, expected string",
                type_name(ty)
            )));
        }
        let value = r.bytes("general.architecture")?;
        let arch =
            String::from_utf8(value).map_err(|_| r.error("general.architecture is not UTF-8"))?;
        if arch.is_empty() {
            return Err(r.error("general.architecture is empty"));
        }
        return Ok(arch);
    }
    Err(r.error("missing general.architecture"))
}

/// The values of `prefix` followed by one of [`KEYS`], by that suffix, from a second pass
/// over the key/value pairs. Checks every value's type as it is read.
fn read_values(path: &Path, prefix: &str) -> Result<BTreeMap<&'static str, Value>, WeightsError> {
    let (mut r, counts) = gguf::open(path)?;
    let mut values = BTreeMap::new();
    let mut architectures = 0;
    for _ in 0..counts.kvs {
        let (key, ty) = gguf::read_key(&mut r)?;
        if key == b"general.architecture" {
            architectures += 1;
            if architectures > 1 {
                return Err(r.error("general.architecture appears twice"));
            }
        }
        let wanted = key
            .strip_prefix(prefix.as_bytes())
            .and_then(|rest| KEYS.iter().copied().find(|k| k.as_bytes() == rest));
        let Some(suffix) = wanted else {
            gguf::skip_value(&mut r, ty)?;
            continue;
        };
        let name = format!("{prefix}{suffix}");
        let value = read_value(&mut r, &name, ty)?;
        if values.insert(suffix, value).is_some() {
            return Err(r.error(format!("{name} appears twice")));
        }
    }
    Ok(values)
}

/// An integer metadata value: one number, or an array of at most [`MAX_LAYERS`].
#[derive(Debug)]
enum Value {
    Single(u64),
    Array(Vec<u64>),
}

impl Value {
    /// The value of a key that takes one number.
    fn single(&self, key: &str) -> Result<u64, String> {
        match self {
            Value::Single(v) => Ok(*v),
            Value::Array(_) => Err(format!("{key} is an array, expected a single integer")),
        }
    }

    /// The value of each of `layers` layers: one number for all, or an array of one each.
    fn per_layer(&self, key: &str, layers: usize) -> Result<Vec<u32>, String> {
        let to_u32 = |v: u64| u32::try_from(v).map_err(|_| too_large(key, v));
        match self {
            Value::Single(v) => Ok(vec![to_u32(*v)?; layers]),
            Value::Array(vs) if vs.len() != layers => Err(format!(
                "{key} has {} per-layer values, expected one for each of the {layers} layers",
                vs.len()
            )),
            Value::Array(vs) => vs.iter().map(|&v| to_u32(v)).collect(),
        }
    }
}

/// Reads the value of `key`, of value type `ty`: a non-negative integer of any integer
/// type, or an array of at most [`MAX_LAYERS`] of them.
fn read_value(r: &mut Reader<'_>, key: &str, ty: u32) -> Result<Value, WeightsError> {
    if ty != value_type::ARRAY {
        return read_integer(r, key, ty).map(Value::Single);
    }
    let elem = r.u32(key)?;
    let len = r.u64(key)?;
    if !is_integer(elem) {
        return Err(r.error(format!("{key} is an array of {}, expected integers", type_name(elem))));
    }
    if len > MAX_LAYERS {
        return Err(r.error(format!(
            "{key} is an array of {len} values; llama.cpp supports at most {MAX_LAYERS} layers"
        )));
    }
    (0..len).map(|_| read_integer(r, key, elem)).collect::<Result<_, _>>().map(Value::Array)
}

fn too_large(key: &str, value: u64) -> String {
    format!("{key} is {value}, more than {} (a 32-bit count)", u32::MAX)
}

fn is_integer(ty: u32) -> bool {
    use value_type::*;
    matches!(ty, UINT8 | INT8 | UINT16 | INT16 | UINT32 | INT32 | UINT64 | INT64)
}

fn read_integer(r: &mut Reader<'_>, key: &str, ty: u32) -> Result<u64, WeightsError> {
    use value_type::*;
    let value = match ty {
        UINT8 => i128::from(u8::from_le_bytes(r.array(key)?)),
        INT8 => i128::from(i8::from_le_bytes(r.array(key)?)),
        UINT16 => i128::from(u16::from_le_bytes(r.array(key)?)),
        INT16 => i128::from(i16::from_le_bytes(r.array(key)?)),
        UINT32 => i128::from(u32::from_le_bytes(r.array(key)?)),
        INT32 => i128::from(i32::from_le_bytes(r.array(key)?)),
        UINT64 => i128::from(u64::from_le_bytes(r.array(key)?)),
        INT64 => i128::from(i64::from_le_bytes(r.array(key)?)),
        other => {
            return Err(
                r.error(format!("{key} has value type {}, expected an integer", type_name(other)))
            );
        }
    };
    u64::try_from(value)
        .map_err(|_| r.error(format!("{key} is {value}, expected a non-negative integer")))
}

/// A metadata value type as gguf-py names it.
fn type_name(ty: u32) -> String {
    use value_type::*;
    let name = match ty {
        UINT8 => "uint8",
        INT8 => "int8",
        UINT16 => "uint16",
        INT16 => "int16",
        UINT32 => "uint32",
        INT32 => "int32",
        FLOAT32 => "float32",
        BOOL => "bool",
        STRING => "string",
        ARRAY => "array",
        UINT64 => "uint64",
        INT64 => "int64",
        FLOAT64 => "float64",
        other => return format!("unknown ({other})"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cache_type_is_a_ggml_type() {
        for name in CACHE_TYPES {
            assert!(cache_type(name).is_some(), "{name}");
        }
        assert_eq!(cache_type("q8_0").map(|t| (t.block, t.size)), Some((32, 34)));
        assert_eq!(cache_type("Q8_0"), None);
        assert_eq!(cache_type("q4_k"), None);
    }
}
