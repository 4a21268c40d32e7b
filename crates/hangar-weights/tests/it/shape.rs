//! GGUF attention shapes and KV-cache sizes: hand-built headers, corrupt ones, and the
//! committed fixture models.

use std::path::Path;

use hangar_weights::{GgufShape, WeightsError, gguf_shape};

use crate::support;
use crate::support::{Gguf, TempDir, fixture, kv, kv_string};

// GGUF metadata value types.
const UINT8: u32 = 0;
const INT8: u32 = 1;
const UINT16: u32 = 2;
const INT16: u32 = 3;
const UINT32: u32 = 4;
const INT32: u32 = 5;
const FLOAT32: u32 = 6;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const UINT64: u32 = 10;
const INT64: u32 = 11;

/// `v` encoded as a value of integer type `ty` (truncated to its width).
fn int(ty: u32, v: i64) -> Vec<u8> {
    match ty {
        UINT8 | INT8 => vec![v as u8],
        UINT16 | INT16 => (v as u16).to_le_bytes().to_vec(),
        UINT32 | INT32 => (v as u32).to_le_bytes().to_vec(),
        UINT64 | INT64 => v.to_le_bytes().to_vec(),
        other => panic!("not an integer type: {other}"),
    }
}

fn kv_u32(key: &str, v: u32) -> Vec<u8> {
    kv(key, UINT32, &v.to_le_bytes())
}

/// An array pair of `values`, each encoded as integer type `elem`.
fn kv_array(key: &str, elem: u32, values: &[i64]) -> Vec<u8> {
    let mut encoded = elem.to_le_bytes().to_vec();
    encoded.extend((values.len() as u64).to_le_bytes());
    for &v in values {
        encoded.extend(int(elem, v));
    }
    kv(key, ARRAY, &encoded)
}

/// A `llama` header of 4 layers, 8 heads of 64 over an embedding of 512, 2 KV heads and
/// a trained context of 4096, without the pairs whose keys `skip` lists.
fn llama(skip: &[&str]) -> Vec<Vec<u8>> {
    let pairs = [
        ("general.architecture", kv_string("general.architecture", "llama")),
        ("llama.block_count", kv_u32("llama.block_count", 4)),
        ("llama.context_length", kv_u32("llama.context_length", 4096)),
        ("llama.embedding_length", kv_u32("llama.embedding_length", 512)),
        ("llama.attention.head_count", kv_u32("llama.attention.head_count", 8)),
        ("llama.attention.head_count_kv", kv_u32("llama.attention.head_count_kv", 2)),
        ("llama.attention.key_length", kv_u32("llama.attention.key_length", 64)),
        ("llama.attention.value_length", kv_u32("llama.attention.value_length", 64)),
    ];
    pairs.into_iter().filter(|(k, _)| !skip.contains(k)).map(|(_, pair)| pair).collect()
}

/// The shape of a GGUF file holding these metadata pairs (and one small tensor).
fn shape_of(kvs: Vec<Vec<u8>>) -> Result<GgufShape, WeightsError> {
    let dir = TempDir::new("shape");
    gguf_shape(&dir.write("m.gguf", &Gguf { kvs, ..Gguf::default() }.bytes()))
}

/// `gguf_shape(path)` is a format error naming the file whose message contains `needle`.
fn check_format(path: &Path, needle: &str) {
    support::check_format(gguf_shape(path), path, needle);
}

#[test]
fn scalar_head_count_kv_gives_the_fields_and_the_exact_cache_size() {
    let shape = shape_of(llama(&[])).unwrap();

    assert_eq!(
        shape,
        GgufShape {
            architecture: "llama".into(),
            block_count: 4,
            context_length: Some(4096),
            head_count_kv: vec![2; 4],
            key_length: 64,
            value_length: 64,
            sliding_window: None,
        }
    );
    let (layers, heads, n_ctx) = (4, 2, 1024);
    // f16: 2 bytes an element, for 2 × 64 key and 2 × 64 value elements a token and layer.
    let f16 = layers * n_ctx * (heads * 64 * 2 + heads * 64 * 2);
    assert_eq!(shape.kv_cache_bytes(n_ctx, "f16", "f16"), Some(f16));
    assert_eq!(f16, 2 * 1024 * 1024);
    // q8_0 keys: 128 elements are 4 blocks of 34 bytes; q4_0 values: 4 blocks of 18 bytes.
    let q8_q4 = layers * n_ctx * (heads * 64 / 32 * 34 + heads * 64 / 32 * 18);
    assert_eq!(shape.kv_cache_bytes(n_ctx, "q8_0", "q4_0"), Some(q8_q4));
    assert_eq!(q8_q4, 851_968);
    assert_eq!(shape.kv_cache_bytes(0, "f16", "f16"), Some(0));
}

#[test]
fn every_cache_type_counts_its_block_bytes() {
    let shape = shape_of(llama(&[])).unwrap();
    // (name, bytes, elements) of one block, as ggml's type traits state them.
    let types = [
        ("f32", 4, 1),
        ("f16", 2, 1),
        ("bf16", 2, 1),
        ("q8_0", 34, 32),
        ("q4_0", 18, 32),
        ("q4_1", 20, 32),
        ("iq4_nl", 18, 32),
        ("q5_0", 22, 32),
        ("q5_1", 24, 32),
    ];
    for (k, k_bytes, k_block) in types {
        for (v, v_bytes, v_block) in types {
            let per_token = 4 * (2 * 64 / k_block * k_bytes + 2 * 64 / v_block * v_bytes);
            assert_eq!(shape.kv_cache_bytes(10, k, v), Some(10 * per_token), "{k}/{v}");
        }
    }
}

#[test]
fn unknown_cache_types_have_no_size() {
    let shape = shape_of(llama(&[])).unwrap();
    // llama.cpp matches lower-case names exactly, and only its nine cache types.
    for bad in ["", "F16", "Q8_0", "q8_1", "q4_k", "f64", "i8", "fp16"] {
        assert_eq!(shape.kv_cache_bytes(1024, bad, "f16"), None, "K {bad:?}");
        assert_eq!(shape.kv_cache_bytes(1024, "f16", bad), None, "V {bad:?}");
    }
}

#[test]
fn per_layer_head_count_kv_array_sizes_each_layer() {
    let mut kvs = llama(&[
        "llama.block_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.attention.value_length",
    ]);
    kvs.push(kv_u32("llama.block_count", 3));
    // A layer without attention (0 KV heads), as hybrid models have.
    kvs.push(kv_array("llama.attention.head_count_kv", INT32, &[4, 0, 2]));
    kvs.push(kv_u32("llama.attention.key_length", 128));
    kvs.push(kv_u32("llama.attention.value_length", 96));

    let shape = shape_of(kvs).unwrap();

    assert_eq!(shape.head_count_kv, [4, 0, 2]);
    assert_eq!((shape.block_count, shape.key_length, shape.value_length), (3, 128, 96));
    // f16 keys (2 bytes an element), q8_0 values (34 bytes a block of 32 elements).
    let layer = |heads: u64| heads * 128 * 2 + heads * 96 / 32 * 34;
    let expected = 100 * (layer(4) + layer(0) + layer(2));
    assert_eq!(shape.kv_cache_bytes(100, "f16", "q8_0"), Some(expected));
    assert_eq!(expected, 214_800);
}

#[test]
fn a_partial_block_takes_a_whole_block() {
    let mut kvs = llama(&["llama.attention.head_count_kv", "llama.attention.key_length"]);
    kvs.push(kv_u32("llama.attention.head_count_kv", 1));
    kvs.push(kv_u32("llama.attention.key_length", 40));
    let shape = shape_of(kvs).unwrap();
    // A 40-element q8_0 key row takes 2 blocks (68 bytes), not 40 × 34 / 32 = 42.5.
    let per_token = 4 * (2 * 34 + 64 * 2);
    assert_eq!(shape.kv_cache_bytes(7, "q8_0", "f16"), Some(7 * per_token));
}

#[test]
fn cache_size_saturates_instead_of_overflowing() {
    let shape = shape_of(llama(&[])).unwrap();
    assert_eq!(shape.kv_cache_bytes(u64::MAX, "f32", "f32"), Some(u64::MAX));
    let huge = GgufShape {
        head_count_kv: vec![u32::MAX; 512],
        key_length: u32::MAX,
        value_length: u32::MAX,
        ..shape
    };
    assert_eq!(huge.kv_cache_bytes(1, "f32", "f32"), Some(u64::MAX));
}

#[test]
fn absent_head_sizes_derive_from_embedding_length_and_head_count() {
    let shape =
        shape_of(llama(&["llama.attention.key_length", "llama.attention.value_length"])).unwrap();
    assert_eq!((shape.key_length, shape.value_length), (512 / 8, 512 / 8));

    // Each defaults on its own: a stated value length leaves the key length derived.
    let mut kvs = llama(&["llama.attention.key_length", "llama.attention.value_length"]);
    kvs.push(kv_u32("llama.attention.value_length", 48));
    let shape = shape_of(kvs).unwrap();
    assert_eq!((shape.key_length, shape.value_length), (64, 48));
    // … and a stated key length leaves the value length derived, not copied (llama.cpp).
    let mut kvs = llama(&["llama.attention.key_length", "llama.attention.value_length"]);
    kvs.push(kv_u32("llama.attention.key_length", 128));
    let shape = shape_of(kvs).unwrap();
    assert_eq!((shape.key_length, shape.value_length), (128, 64));

    // A per-layer head count derives from the first layer's, as llama.cpp does.
    let mut kvs = llama(&[
        "llama.attention.key_length",
        "llama.attention.value_length",
        "llama.attention.head_count",
    ]);
    kvs.push(kv_array("llama.attention.head_count", UINT32, &[4, 8, 8, 8]));
    let shape = shape_of(kvs).unwrap();
    assert_eq!((shape.key_length, shape.value_length), (128, 128));
}

#[test]
fn absent_head_count_kv_falls_back_to_head_count() {
    let shape = shape_of(llama(&["llama.attention.head_count_kv"])).unwrap();
    assert_eq!(shape.head_count_kv, [8; 4]);

    let mut kvs = llama(&["llama.attention.head_count_kv", "llama.attention.head_count"]);
    kvs.push(kv_array("llama.attention.head_count", UINT16, &[8, 8, 4, 4]));
    assert_eq!(shape_of(kvs).unwrap().head_count_kv, [8, 8, 4, 4]);
}

#[test]
fn integer_keys_accept_every_integer_type() {
    for ty in [UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64] {
        let mut kvs = llama(&["llama.block_count", "llama.context_length"]);
        kvs.push(kv("llama.block_count", ty, &int(ty, 4)));
        kvs.push(kv("llama.context_length", ty, &int(ty, 100)));
        kvs.push(kv("llama.attention.sliding_window", ty, &int(ty, 64)));
        let shape = shape_of(kvs).unwrap_or_else(|e| panic!("type {ty}: {e}"));
        assert_eq!(
            (shape.block_count, shape.context_length, shape.sliding_window),
            (4, Some(100), Some(64)),
            "type {ty}"
        );
    }
    let mut kvs = llama(&["llama.context_length"]);
    kvs.push(kv("llama.context_length", UINT64, &int(UINT64, 1 << 40)));
    assert_eq!(shape_of(kvs).unwrap().context_length, Some(1 << 40));
}

#[test]
fn only_the_architecture_keys_count_wherever_the_architecture_is_listed() {
    // Keys of another architecture come first, `general.architecture` last.
    let mut kvs: Vec<Vec<u8>> = llama(&["general.architecture"]);
    kvs.extend([
        kv_u32("qwen2.block_count", 2),
        kv_u32("qwen2.embedding_length", 256),
        kv_u32("qwen2.attention.head_count", 4),
        kv_u32("qwen2.attention.sliding_window", 4096),
        kv_u32("qwen2.block_count_extra", 99),
        kv_string("general.architecture", "qwen2"),
    ]);
    let shape = shape_of(kvs).unwrap();
    assert_eq!(
        shape,
        GgufShape {
            architecture: "qwen2".into(),
            block_count: 2,
            context_length: None,
            head_count_kv: vec![4, 4],
            key_length: 64,
            value_length: 64,
            sliding_window: Some(4096),
        }
    );
}

#[test]
fn only_the_metadata_is_read() {
    // Tensor infos pointing past the end of a file with no data at all.
    let dir = TempDir::new("shape-no-data");
    let path = dir.write("m.gguf", &Gguf { kvs: llama(&[]), data: &[], ..Gguf::default() }.bytes());
    assert!(hangar_weights::digest(&path).is_err());
    assert_eq!(gguf_shape(&path).unwrap().block_count, 4);
}

#[test]
fn malformed_shape_metadata_is_a_format_error_naming_the_key() {
    let with = |skip: &[&str], extra: Vec<Vec<u8>>| {
        let mut kvs = llama(skip);
        kvs.extend(extra);
        Gguf { kvs, ..Gguf::default() }
    };
    let hc = "llama.attention.head_count";
    let hc_kv = "llama.attention.head_count_kv";
    let huge_array = {
        let mut v = UINT32.to_le_bytes().to_vec();
        v.extend((1u64 << 40).to_le_bytes());
        v
    };
    let cases: Vec<(&str, Gguf<'_>, &str)> = vec![
        ("not-gguf", Gguf { magic: b"GGML", ..Gguf::default() }, "not a GGUF file"),
        ("v1", Gguf { version: 1, ..Gguf::default() }, "unsupported GGUF version 1"),
        ("no-arch", with(&["general.architecture"], vec![]), "missing general.architecture"),
        (
            "arch-type",
            with(&["general.architecture"], vec![kv_u32("general.architecture", 1)]),
            "general.architecture has value type uint32",
        ),
        (
            "arch-twice",
            with(&[], vec![kv_string("general.architecture", "llama")]),
            "general.architecture appears twice",
        ),
        ("no-block-count", with(&["llama.block_count"], vec![]), "missing llama.block_count"),
        (
            "zero-layers",
            with(&["llama.block_count"], vec![kv_u32("llama.block_count", 0)]),
            "llama.block_count is 0",
        ),
        (
            "too-many-layers",
            with(&["llama.block_count"], vec![kv_u32("llama.block_count", 513)]),
            "llama.block_count is 513; llama.cpp supports 1 to 512",
        ),
        (
            "block-count-array",
            with(&["llama.block_count"], vec![kv_array("llama.block_count", UINT32, &[4])]),
            "llama.block_count is an array, expected a single integer",
        ),
        (
            "block-count-twice",
            with(&[], vec![kv_u32("llama.block_count", 4)]),
            "llama.block_count appears twice",
        ),
        ("no-heads", with(&[hc, hc_kv], vec![]), "missing llama.attention.head_count_kv and"),
        (
            "length-mismatch",
            with(&[hc_kv], vec![kv_array(hc_kv, INT32, &[2, 2, 2])]),
            "llama.attention.head_count_kv has 3 per-layer values, expected one for each of the 4",
        ),
        (
            "head-count-length",
            with(&[hc], vec![kv_array(hc, INT32, &[8, 8, 8, 8, 8])]),
            "llama.attention.head_count has 5 per-layer values",
        ),
        (
            "huge-array",
            with(&[hc_kv], vec![kv(hc_kv, ARRAY, &huge_array)]),
            "llama.attention.head_count_kv is an array of 1099511627776 values",
        ),
        (
            "string-array",
            with(&[hc_kv], vec![kv(hc_kv, ARRAY, &[STRING.to_le_bytes(), [0; 4]].concat())]),
            "llama.attention.head_count_kv is an array of string, expected integers",
        ),
        (
            "string",
            with(&[hc], vec![kv_string(hc, "8")]),
            "llama.attention.head_count has value type string, expected an integer",
        ),
        (
            "float",
            with(&["llama.context_length"], vec![kv("llama.context_length", FLOAT32, &[0; 4])]),
            "llama.context_length has value type float32",
        ),
        (
            "negative",
            with(&[hc_kv], vec![kv(hc_kv, INT8, &int(INT8, -1))]),
            "llama.attention.head_count_kv is -1, expected a non-negative integer",
        ),
        (
            "negative-in-array",
            with(&[hc_kv], vec![kv_array(hc_kv, INT64, &[2, 2, -2, 2])]),
            "llama.attention.head_count_kv is -2",
        ),
        (
            "over-u32",
            with(
                &["llama.attention.key_length"],
                vec![kv("llama.attention.key_length", UINT64, &int(UINT64, 1 << 32))],
            ),
            "llama.attention.key_length is 4294967296, more than",
        ),
        (
            "underivable",
            with(&["llama.embedding_length", "llama.attention.key_length"], vec![]),
            "missing llama.attention.key_length, and it cannot be derived",
        ),
    ];
    let dir = TempDir::new("shape-bad");
    for (name, gguf, needle) in cases {
        check_format(&dir.write(&format!("{name}.gguf"), &gguf.bytes()), needle);
    }
}

#[test]
fn every_truncation_of_the_metadata_is_a_format_error() {
    let whole = Gguf { kvs: llama(&[]), ..Gguf::default() }.bytes();
    let metadata_end = 24 + llama(&[]).concat().len();
    let dir = TempDir::new("shape-truncate");
    for len in 0..metadata_end {
        check_format(&dir.write(&format!("cut-{len}.gguf"), &whole[..len]), "");
    }
    // Cut inside the last pair's value: the message names the key being read.
    let cut = dir.write("cut-value.gguf", &whole[..metadata_end - 2]);
    check_format(&cut, "truncated header: llama.attention.value_length needs 4 bytes");
}

#[test]
fn a_missing_file_is_an_io_error() {
    let dir = TempDir::new("shape-missing");
    let err = gguf_shape(&dir.path().join("absent.gguf")).unwrap_err();
    assert!(matches!(err, WeightsError::Io { .. }), "{err:?}");
}

/// The fixtures' parameters, as `xtask/src/fixtures.rs` writes them: `tiny_llama()` (2
/// layers, n_embd 64, 2 heads, 1 KV head, context 2048, no key_length) and `tiny_bert()`
/// (2 layers, n_embd 64, 2 heads, no head_count_kv, context 512) for both BERT files.
#[test]
fn fixture_models_have_the_generator_parameters() {
    let llama = gguf_shape(&fixture("tiny-llama.gguf")).unwrap();
    assert_eq!(
        llama,
        GgufShape {
            architecture: "llama".into(),
            block_count: 2,
            context_length: Some(2048),
            head_count_kv: vec![1, 1],
            key_length: 64 / 2,
            value_length: 64 / 2,
            sliding_window: None,
        }
    );
    // 2 layers × 2048 tokens × (32 key + 32 value elements) × 2 bytes.
    assert_eq!(llama.kv_cache_bytes(2048, "f16", "f16"), Some(2 * 2048 * 64 * 2));
    // Head size 32 is one q8_0 block: 34 bytes each for the key and the value row.
    assert_eq!(llama.kv_cache_bytes(2048, "q8_0", "q8_0"), Some(2 * 2048 * 2 * 34));

    for file in ["tiny-embed.gguf", "tiny-rerank.gguf"] {
        let bert = gguf_shape(&fixture(file)).unwrap();
        assert_eq!(
            bert,
            GgufShape {
                architecture: "bert".into(),
                block_count: 2,
                context_length: Some(512),
                head_count_kv: vec![2, 2],
                key_length: 32,
                value_length: 32,
                sliding_window: None,
            },
            "{file}"
        );
    }
}
