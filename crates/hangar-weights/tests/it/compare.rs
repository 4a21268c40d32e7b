//! `compare` over hand-built digests.

use hangar_weights::{Comparison, TensorDigest, WeightsDigest, WeightsFormat, compare};

fn weights(tensors: &[(&str, &str)]) -> WeightsDigest {
    WeightsDigest {
        format: WeightsFormat::Gguf,
        files: vec!["m.gguf".into()],
        tensors: tensors
            .iter()
            .map(|(name, sha)| TensorDigest {
                name: (*name).into(),
                dtype: "F32".into(),
                shape: vec![1],
                bytes: 4,
                sha256: (*sha).into(),
            })
            .collect(),
        checksum: "c".into(),
        bytes: 4 * tensors.len() as u64,
    }
}

fn check(snapshot: &[(&str, &str)], current: &[(&str, &str)], expected: Comparison) {
    assert_eq!(compare(&weights(snapshot), &weights(current)), expected);
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn equal_tensors_compare_identical() {
    let same = [("a", "1"), ("b", "2")];
    let expected = Comparison {
        identical: true,
        changed: vec![],
        missing: vec![],
        added: vec![],
        compared: 2,
    };
    check(&same, &same, expected);
}

#[test]
fn differences_are_reported_by_name_sorted() {
    check(
        &[("d", "4"), ("a", "1"), ("b", "2"), ("c", "3"), ("z", "9")],
        &[("y", "8"), ("c", "3"), ("a", "x"), ("d", "y"), ("e", "5")],
        Comparison {
            identical: false,
            changed: names(&["a", "d"]),
            missing: names(&["b", "z"]),
            added: names(&["e", "y"]),
            compared: 3,
        },
    );
}

#[test]
fn only_added_tensors_are_not_identical() {
    check(
        &[("a", "1")],
        &[("a", "1"), ("b", "2")],
        Comparison {
            identical: false,
            changed: vec![],
            missing: vec![],
            added: names(&["b"]),
            compared: 1,
        },
    );
}

#[test]
fn comparison_serializes_its_fields() {
    let c = compare(&weights(&[("a", "1")]), &weights(&[]));
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"identical": false, "changed": [], "missing": ["a"], "added": [], "compared": 0})
    );
    assert_eq!(serde_json::to_value(WeightsFormat::Gguf).unwrap(), "gguf");
}
