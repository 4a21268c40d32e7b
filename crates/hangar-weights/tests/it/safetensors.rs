//! Safetensors digests: hand-written files and sharded directories.

use hangar_weights::{WeightsError, WeightsFormat, compare, digest};

use crate::support;
use crate::support::{
    StTensor, TempDir, expected_checksum, expected_tensor_digest, safetensors_bytes,
    safetensors_with_header,
};

const EMBED: [u8; 24] =
    [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64, 0, 0, 192, 64];
const NORM: [u8; 4] = [0, 0x3f, 0x80, 0x3f];

fn embed() -> StTensor<'static> {
    StTensor { name: "model.embed_tokens.weight", dtype: "F32", shape: &[2, 3], data: &EMBED }
}

fn norm() -> StTensor<'static> {
    StTensor { name: "model.norm.weight", dtype: "BF16", shape: &[2], data: &NORM }
}

#[test]
fn single_file_digests_match_the_documented_encoding() {
    let dir = TempDir::new("st-single");
    let path = dir.write("model.safetensors", &safetensors_bytes(&[norm(), embed()]));

    let d = digest(&path).unwrap();

    let embed_sha = expected_tensor_digest("model.embed_tokens.weight", "F32", &[2, 3], &EMBED);
    let norm_sha = expected_tensor_digest("model.norm.weight", "BF16", &[2], &NORM);
    assert_eq!(d.format, WeightsFormat::Safetensors);
    assert_eq!(d.files, [path]);
    assert_eq!(d.bytes, 28);
    let t = &d.tensors;
    assert_eq!(t.len(), 2);
    assert_eq!(
        (t[0].name.as_str(), t[0].dtype.as_str(), &t[0].shape[..], t[0].bytes),
        ("model.embed_tokens.weight", "F32", &[2, 3][..], 24)
    );
    assert_eq!(t[0].sha256, embed_sha);
    assert_eq!((t[1].name.as_str(), &t[1].sha256), ("model.norm.weight", &norm_sha));
    assert_eq!(
        d.checksum,
        expected_checksum(&[
            ("model.norm.weight", &norm_sha),
            ("model.embed_tokens.weight", &embed_sha)
        ])
    );
}

#[test]
fn shards_in_a_directory_digest_like_one_file() {
    let single = TempDir::new("st-one");
    let one = digest(&single.write("model.safetensors", &safetensors_bytes(&[embed(), norm()])));

    let sharded = TempDir::new("st-shards");
    // Written out of order: the digest reads shards in file-name order.
    let second = sharded.write("model-00002-of-00002.safetensors", &safetensors_bytes(&[norm()]));
    let first = sharded.write("model-00001-of-00002.safetensors", &safetensors_bytes(&[embed()]));
    sharded.write("model.safetensors.index.json", b"{}");
    let shards = digest(sharded.path()).unwrap();

    assert_eq!(shards.files, [first, second]);
    let one = one.unwrap();
    assert_eq!((&shards.tensors, &shards.checksum), (&one.tensors, &one.checksum));
}

#[test]
fn data_order_in_the_file_does_not_change_digests() {
    let header = r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]},
        "model.norm.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
    let dir = TempDir::new("st-order");
    let reordered =
        dir.write("a.safetensors", &safetensors_with_header(header, &[norm(), embed()]));
    let plain = dir.write("b.safetensors", &safetensors_bytes(&[embed(), norm()]));

    assert_eq!(digest(&reordered).unwrap().checksum, digest(&plain).unwrap().checksum);
}

#[test]
fn renaming_a_tensor_changes_its_digest() {
    let dir = TempDir::new("st-rename");
    let before = digest(&dir.write("a.safetensors", &safetensors_bytes(&[embed(), norm()])));
    let renamed = StTensor { name: "model.final_norm.weight", ..norm() };
    let after = digest(&dir.write("b.safetensors", &safetensors_bytes(&[embed(), renamed])));
    let (before, after) = (before.unwrap(), after.unwrap());

    let norm_of = |d: &hangar_weights::WeightsDigest| d.tensors[1].sha256.clone();
    assert_ne!(norm_of(&before), norm_of(&after));
    assert_ne!(before.checksum, after.checksum);
    let report = compare(&before, &after);
    assert_eq!(report.missing, ["model.norm.weight"]);
    assert_eq!(report.added, ["model.final_norm.weight"]);
    assert!(report.changed.is_empty());
    assert_eq!(report.compared, 1);
    assert!(!report.identical);
}

#[test]
fn changing_a_shape_or_dtype_with_the_same_bytes_changes_the_digest() {
    let dir = TempDir::new("st-shape");
    let base = digest(&dir.write("base.safetensors", &safetensors_bytes(&[embed()]))).unwrap();
    let variants = [
        StTensor { shape: &[3, 2], ..embed() },
        StTensor { shape: &[6], ..embed() },
        StTensor { dtype: "I32", ..embed() },
    ];
    for (i, variant) in variants.into_iter().enumerate() {
        let path = dir.write(&format!("v{i}.safetensors"), &safetensors_bytes(&[variant]));
        let d = digest(&path).unwrap();
        assert_ne!(d.tensors[0].sha256, base.tensors[0].sha256, "variant {i}");
        assert_eq!(compare(&base, &d).changed, ["model.embed_tokens.weight"], "variant {i}");
    }
}

#[test]
fn a_tensor_in_two_shards_is_a_duplicate() {
    let dir = TempDir::new("st-dup");
    dir.write("a.safetensors", &safetensors_bytes(&[embed(), norm()]));
    dir.write("b.safetensors", &safetensors_bytes(&[norm()]));

    let err = digest(dir.path()).unwrap_err();
    assert!(
        matches!(&err, WeightsError::DuplicateTensor { name, .. } if name == "model.norm.weight"),
        "{err:?}"
    );
    assert!(err.to_string().contains("b.safetensors"), "{err}");
}

#[test]
fn safetensors_files_win_over_gguf_files_in_a_directory() {
    let dir = TempDir::new("st-over-gguf");
    std::fs::copy(support::fixture("tiny-llama.gguf"), dir.path().join("model.gguf")).unwrap();
    let st = dir.write("model.safetensors", &safetensors_bytes(&[norm()]));

    let d = digest(dir.path()).unwrap();
    assert_eq!((d.format, d.files), (WeightsFormat::Safetensors, vec![st]));
}

#[test]
fn digests_serialize_with_lowercase_formats_and_round_trip() {
    let dir = TempDir::new("st-serde");
    let d = digest(&dir.write("m.safetensors", &safetensors_bytes(&[norm()]))).unwrap();

    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["format"], "safetensors");
    assert_eq!(json["tensors"][0]["shape"], serde_json::json!([2]));
    assert_eq!(serde_json::from_value::<hangar_weights::WeightsDigest>(json).unwrap(), d);
}
