//! GGUF digests: the committed tiny-llama fixture and hand-built files.

use hangar_weights::{WeightsError, WeightsFormat, compare, digest, locate_tensors};

use crate::support;
use crate::support::{Gguf, GgufTensor, TempDir, fixture, flip_byte, kv, kv_string};

fn tiny_llama() -> std::path::PathBuf {
    fixture("tiny-llama.gguf")
}

#[test]
fn fixture_digest_covers_every_tensor_in_the_header() {
    let bytes = std::fs::read(tiny_llama()).unwrap();
    let tensor_count = u64::from_le_bytes(bytes[8..16].try_into().unwrap());

    let d = digest(&tiny_llama()).unwrap();

    assert_eq!(d.format, WeightsFormat::Gguf);
    assert_eq!(d.files, [tiny_llama()]);
    assert_eq!(d.tensors.len() as u64, tensor_count);
    assert!(d.tensors.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
    assert_eq!(d.bytes, d.tensors.iter().map(|t| t.bytes).sum::<u64>());
    for t in &d.tensors {
        // The fixture is all F32.
        assert_eq!(t.dtype, "F32", "{}", t.name);
        assert_eq!(t.bytes, 4 * t.shape.iter().product::<u64>(), "{}", t.name);
        assert_eq!(t.sha256.len(), 64);
        assert!(t.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
    assert!(d.tensors.iter().any(|t| t.name == "token_embd.weight" && t.shape == [64, 364]));
}

#[test]
fn fixture_tensors_lie_inside_the_file_and_do_not_overlap() {
    let len = std::fs::metadata(tiny_llama()).unwrap().len();
    let mut located = locate_tensors(&tiny_llama()).unwrap();
    let d = digest(&tiny_llama()).unwrap();

    assert_eq!(located.len(), d.tensors.len());
    for (loc, t) in located.iter().zip(&d.tensors) {
        assert_eq!((&loc.name, loc.range.end - loc.range.start), (&t.name, t.bytes));
        assert!(loc.range.start <= loc.range.end && loc.range.end <= len, "{}", loc.name);
        assert_eq!(loc.range.start % 32, 0, "{} is aligned", loc.name);
    }
    located.sort_by_key(|l| l.range.start);
    assert!(located.windows(2).all(|w| w[0].range.end <= w[1].range.start));
}

#[test]
fn digest_is_deterministic_and_independent_of_the_file_path() {
    let dir = TempDir::new("deterministic");
    let copy = dir.path().join("renamed.gguf");
    std::fs::copy(tiny_llama(), &copy).unwrap();

    let first = digest(&tiny_llama()).unwrap();
    assert_eq!(digest(&tiny_llama()).unwrap(), first);
    let moved = digest(&copy).unwrap();
    assert_eq!((&moved.tensors, &moved.checksum), (&first.tensors, &first.checksum));
}

#[test]
fn flipping_a_tensor_byte_changes_exactly_that_tensor() {
    let dir = TempDir::new("flip-tensor");
    let copy = dir.path().join("model.gguf");
    std::fs::copy(tiny_llama(), &copy).unwrap();
    let before = digest(&copy).unwrap();
    let located = locate_tensors(&copy).unwrap();
    let target = &located[located.len() / 2];
    flip_byte(&copy, target.range.start + (target.range.end - target.range.start) / 2);

    let after = digest(&copy).unwrap();
    let report = compare(&before, &after);

    assert_eq!(report.changed, std::slice::from_ref(&target.name));
    assert!(report.missing.is_empty() && report.added.is_empty());
    assert_eq!(report.compared, before.tensors.len());
    assert!(!report.identical);
    assert_ne!(after.checksum, before.checksum);
}

#[test]
fn flipping_a_metadata_byte_changes_no_digest() {
    let dir = TempDir::new("flip-metadata");
    let copy = dir.path().join("model.gguf");
    std::fs::copy(tiny_llama(), &copy).unwrap();
    let before = digest(&copy).unwrap();
    let bytes = std::fs::read(&copy).unwrap();
    // general.architecture's value: key, u32 type (8 = string), u64 length, then "llama".
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(&bytes[at..at + 4], 8u32.to_le_bytes());
    let value = at + 4 + 8;
    assert_eq!(&bytes[value..value + 5], b"llama");
    let first_data = locate_tensors(&copy).unwrap().iter().map(|l| l.range.start).min().unwrap();
    assert!((value as u64) < first_data);

    flip_byte(&copy, value as u64);
    assert_ne!(std::fs::read(&copy).unwrap(), bytes);

    let after = digest(&copy).unwrap();
    assert_eq!((&after.tensors, &after.checksum), (&before.tensors, &before.checksum));
    assert!(compare(&before, &after).identical);
}

#[test]
fn a_directory_of_one_gguf_file_digests_like_the_file() {
    let dir = TempDir::new("gguf-dir");
    std::fs::copy(tiny_llama(), dir.path().join("model.gguf")).unwrap();
    dir.write("README.md", b"not weights");

    let from_dir = digest(dir.path()).unwrap();
    let from_file = digest(&tiny_llama()).unwrap();

    assert_eq!(from_dir.files, [dir.path().join("model.gguf")]);
    assert_eq!(from_dir.checksum, from_file.checksum);
}

#[test]
fn the_same_gguf_twice_in_a_directory_is_a_duplicate_tensor() {
    let dir = TempDir::new("gguf-dup");
    std::fs::copy(tiny_llama(), dir.path().join("a.gguf")).unwrap();
    std::fs::copy(tiny_llama(), dir.path().join("b.gguf")).unwrap();

    match digest(dir.path()) {
        Err(WeightsError::DuplicateTensor { name, first, second }) => {
            assert!(!name.is_empty());
            assert_eq!((first, second), (dir.path().join("a.gguf"), dir.path().join("b.gguf")));
        }
        other => panic!("expected DuplicateTensor, got {other:?}"),
    }
}

#[test]
fn hand_built_gguf_digests_by_the_documented_encoding() {
    let data: Vec<u8> = (0..48).collect();
    let tensors = [
        GgufTensor { name: "b", dims: &[4], ggml_type: 0, offset: 0 },
        GgufTensor { name: "a", dims: &[2, 2], ggml_type: 30, offset: 32 },
    ];
    let dir = TempDir::new("gguf-hand");
    let path =
        dir.write("m.gguf", &Gguf { tensors: &tensors, data: &data, ..Gguf::default() }.bytes());

    let d = digest(&path).unwrap();

    let a = support::expected_tensor_digest("a", "BF16", &[2, 2], &data[32..40]);
    let b = support::expected_tensor_digest("b", "F32", &[4], &data[..16]);
    let names: Vec<_> = d.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!((&d.tensors[0].sha256, &d.tensors[1].sha256), (&a, &b));
    assert_eq!(d.checksum, support::expected_checksum(&[("a", &a), ("b", &b)]));
    assert_eq!(d.bytes, 24);
}

#[test]
fn gguf_version_2_is_read_like_version_3() {
    let dir = TempDir::new("gguf-v2");
    let v2 = digest(&dir.write("v2.gguf", &Gguf { version: 2, ..Gguf::default() }.bytes()));
    let v3 = digest(&dir.write("v3.gguf", &Gguf::default().bytes()));
    assert_eq!(v2.unwrap().tensors, v3.unwrap().tensors);
}

#[test]
fn general_alignment_places_the_data_section() {
    let mut data = vec![0xee; 128];
    data.extend([5; 16]);
    let gguf = Gguf {
        kvs: vec![
            kv_string("tokenizer.ggml.model", "llama"),
            kv("general.alignment", 4, &128u32.to_le_bytes()),
            // Skipped values of other types: a u64 and an array of strings.
            kv("general.file_type", 10, &7u64.to_le_bytes()),
            kv("tokenizer.ggml.tokens", 9, &{
                let mut v = 8u32.to_le_bytes().to_vec();
                v.extend(2u64.to_le_bytes());
                for s in ["<s>", "</s>"] {
                    v.extend((s.len() as u64).to_le_bytes());
                    v.extend(s.as_bytes());
                }
                v
            }),
        ],
        tensors: &[GgufTensor { name: "w", dims: &[4], ggml_type: 0, offset: 128 }],
        alignment: 128,
        data: &data,
        ..Gguf::default()
    };
    let dir = TempDir::new("gguf-align");
    let path = dir.write("m.gguf", &gguf.bytes());

    let located = locate_tensors(&path).unwrap();
    assert_eq!(located[0].range.start % 128, 0);
    let d = digest(&path).unwrap();
    assert_eq!(d.tensors[0].sha256, support::expected_tensor_digest("w", "F32", &[4], &[5; 16]));
}
