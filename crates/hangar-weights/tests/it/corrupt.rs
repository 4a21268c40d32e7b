//! Corrupt and empty inputs are errors naming the file, never panics or huge allocations.

use std::path::Path;

use hangar_weights::{WeightsError, digest};

use crate::support;
use crate::support::{Gguf, GgufTensor, StTensor, TempDir, fixture, kv, safetensors_with_header};

/// `digest(path)` is a format error naming the file whose message contains `needle`.
fn check_format(path: &Path, needle: &str) {
    support::check_format(digest(path), path, needle);
}

#[test]
fn every_truncation_of_a_gguf_file_is_a_format_error() {
    let whole = Gguf::default().bytes();
    let dir = TempDir::new("truncate");
    for len in 0..whole.len() {
        let path = dir.write(&format!("cut-{len}.gguf"), &whole[..len]);
        check_format(&path, "");
    }
}

#[test]
fn truncated_fixture_is_a_format_error() {
    let whole = std::fs::read(fixture("tiny-llama.gguf")).unwrap();
    let dir = TempDir::new("truncate-fixture");
    for len in [3, 20, 1000, whole.len() / 2, whole.len() - 1] {
        check_format(&dir.write(&format!("cut-{len}.gguf"), &whole[..len]), "");
    }
}

#[test]
fn malformed_gguf_headers_are_format_errors() {
    let q8 = [GgufTensor { name: "w", dims: &[16], ggml_type: 8, offset: 0 }];
    let unknown = [GgufTensor { name: "w", dims: &[4], ggml_type: 4, offset: 0 }];
    let unknown_high = [GgufTensor { name: "w", dims: &[4], ggml_type: 99, offset: 0 }];
    let five_dims = [GgufTensor { name: "w", dims: &[1, 1, 1, 1, 4], ggml_type: 0, offset: 0 }];
    let beyond = [GgufTensor { name: "w", dims: &[4], ggml_type: 0, offset: 1 << 20 }];
    let misaligned = [GgufTensor { name: "w", dims: &[2], ggml_type: 0, offset: 8 }];
    let unnamed = [GgufTensor { name: "", dims: &[4], ggml_type: 0, offset: 0 }];
    let overflow = [GgufTensor { name: "w", dims: &[1 << 40, 1 << 40], ggml_type: 0, offset: 0 }];
    let nested = {
        let mut v = 9u32.to_le_bytes().to_vec();
        v.extend(1u64.to_le_bytes());
        v
    };
    let huge_string = u64::MAX.to_le_bytes();
    let cases: Vec<(&str, Gguf<'_>, &str)> = vec![
        ("magic", Gguf { magic: b"GGML", ..Gguf::default() }, "not a GGUF file"),
        ("v1", Gguf { version: 1, ..Gguf::default() }, "unsupported GGUF version 1"),
        ("v4", Gguf { version: 4, ..Gguf::default() }, "unsupported GGUF version 4"),
        ("tensors-max", Gguf { tensor_count: Some(u64::MAX), ..Gguf::default() }, "cannot fit"),
        ("tensors-big", Gguf { tensor_count: Some(1 << 40), ..Gguf::default() }, "cannot fit"),
        ("kvs-max", Gguf { kv_count: Some(u64::MAX), ..Gguf::default() }, "cannot fit"),
        ("kvs-more", Gguf { kv_count: Some(3), ..Gguf::default() }, ""),
        ("q8-block", Gguf { tensors: &q8, ..Gguf::default() }, "block size 32"),
        ("type-4", Gguf { tensors: &unknown, ..Gguf::default() }, "unknown ggml type 4"),
        ("type-99", Gguf { tensors: &unknown_high, ..Gguf::default() }, "unknown ggml type 99"),
        ("dims", Gguf { tensors: &five_dims, ..Gguf::default() }, "5 dimensions"),
        ("beyond", Gguf { tensors: &beyond, ..Gguf::default() }, "beyond the end"),
        ("misaligned", Gguf { tensors: &misaligned, ..Gguf::default() }, "alignment"),
        ("overflow", Gguf { tensors: &overflow, ..Gguf::default() }, "overflows"),
        ("unnamed", Gguf { tensors: &unnamed, ..Gguf::default() }, "empty tensor name"),
        ("empty-key", Gguf { kvs: vec![kv("", 7, &[1])], ..Gguf::default() }, "empty metadata key"),
        (
            "alignment-0",
            Gguf { kvs: vec![kv("general.alignment", 4, &0u32.to_le_bytes())], ..Gguf::default() },
            "not a power of two",
        ),
        (
            "alignment-3",
            Gguf { kvs: vec![kv("general.alignment", 4, &3u32.to_le_bytes())], ..Gguf::default() },
            "not a power of two",
        ),
        (
            "alignment-u64",
            Gguf {
                kvs: vec![kv("general.alignment", 10, &32u64.to_le_bytes())],
                ..Gguf::default()
            },
            "expected 4 (uint32)",
        ),
        ("nested", Gguf { kvs: vec![kv("x", 9, &nested)], ..Gguf::default() }, "nested"),
        ("value-type", Gguf { kvs: vec![kv("x", 13, &[0; 8])], ..Gguf::default() }, "type 13"),
        ("string", Gguf { kvs: vec![kv("x", 8, &huge_string)], ..Gguf::default() }, "truncated"),
    ];
    let dir = TempDir::new("gguf-bad");
    for (name, gguf, needle) in cases {
        check_format(&dir.write(&format!("{name}.gguf"), &gguf.bytes()), needle);
    }
}

#[test]
fn malformed_safetensors_are_format_errors() {
    let data = StTensor { name: "w", dtype: "F32", shape: &[2], data: &[0; 8] };
    let with = |header: &str| safetensors_with_header(header, std::slice::from_ref(&data));
    let mut huge_len = u64::MAX.to_le_bytes().to_vec();
    huge_len.extend(b"{}");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short", vec![1, 2, 3], "shorter than the 8-byte"),
        ("header-len", huge_len, "runs past the end"),
        ("json", with("{not json"), "does not parse"),
        ("array", with("[1, 2]"), "does not parse"),
        ("beyond", with(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}}"#), "run past"),
        (
            "far-beyond",
            with(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}"#),
            "run past",
        ),
        (
            "reversed",
            with(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#),
            "end before",
        ),
        ("no-dtype", with(r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#), "dtype"),
        ("negative", with(r#"{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#), "\"w\""),
    ];
    let dir = TempDir::new("st-bad");
    for (name, bytes, needle) in cases {
        check_format(&dir.write(&format!("{name}.safetensors"), &bytes), needle);
    }
}

#[test]
fn nothing_to_digest_is_empty() {
    let empty_dir = TempDir::new("empty-dir");
    empty_dir.write("config.json", b"{}");
    std::fs::create_dir(empty_dir.path().join("sub.gguf")).unwrap();
    let files = TempDir::new("empty-files");
    let no_tensors = Gguf { tensors: &[], data: &[], ..Gguf::default() };
    let cases = [
        empty_dir.path().to_path_buf(),
        files.write("none.gguf", &no_tensors.bytes()),
        files.write("meta.safetensors", &safetensors_with_header(r#"{"__metadata__":{}}"#, &[])),
    ];
    for path in cases {
        match digest(&path) {
            Err(err @ WeightsError::Empty { .. }) => {
                assert!(err.to_string().contains(&path.display().to_string()), "{err}");
            }
            other => panic!("{}: expected Empty, got {other:?}", path.display()),
        }
    }
}

#[test]
fn a_missing_path_is_an_io_error_naming_it() {
    let dir = TempDir::new("missing");
    let path = dir.path().join("absent.gguf");
    let err = digest(&path).unwrap_err();
    assert!(matches!(err, WeightsError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("absent.gguf"), "{err}");
}
