//! The deep merge of `settings.json` and `local.json`, and reading a config directory.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::ConfigError;

/// The file with the shipped defaults, inside a config directory.
pub const SETTINGS_FILE: &str = "settings.json";
/// The optional file with machine-specific overrides, inside a config directory.
pub const LOCAL_FILE: &str = "local.json";

/// Merges `patch` into `base`: objects merge key by key (recursively), anything else in
/// `patch` — arrays, scalars and an explicit `null` — replaces the value in `base`.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, patch) => *base = patch,
    }
}

/// [`merge`] as a function of two values.
pub fn merged(mut base: Value, patch: Value) -> Value {
    merge(&mut base, patch);
    base
}

/// Reads `settings.json` and, when present, `local.json` from `dir`, and merges them.
///
/// # Errors
/// [`ConfigError::Read`] when `settings.json` is missing or unreadable (or `local.json`
/// exists but cannot be read); [`ConfigError::Parse`] with file, line and column when
/// either file is not valid JSON or is not a JSON object.
pub fn read_merged(dir: &Path) -> Result<Value, ConfigError> {
    let settings = read_json(&dir.join(SETTINGS_FILE))?;
    let local_path = dir.join(LOCAL_FILE);
    match std::fs::metadata(&local_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(settings),
        _ => Ok(merged(settings, read_json(&local_path)?)),
    }
}

/// Reads one JSON config file, which must hold an object.
///
/// # Errors
/// [`ConfigError::Read`] or [`ConfigError::Parse`], naming `path`.
pub fn read_json(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    parse_json(path.to_owned(), &text)
}

fn parse_json(path: PathBuf, text: &str) -> Result<Value, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.clone(),
        line: e.line(),
        column: e.column(),
        message: strip_position(&e.to_string()),
    })?;
    if !value.is_object() {
        return Err(ConfigError::Parse {
            path,
            line: 1,
            column: 1,
            message: "the top level must be a JSON object".into(),
        });
    }
    Ok(value)
}

/// serde_json appends " at line L column C"; the error carries those as fields instead.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn objects_merge_key_by_key() {
        let base = json!({"a": 1, "m": {"x": 1, "y": {"deep": true, "keep": 1}}});
        let patch = json!({"b": 2, "m": {"y": {"deep": false}}});
        assert_eq!(
            merged(base, patch),
            json!({"a": 1, "b": 2, "m": {"x": 1, "y": {"deep": false, "keep": 1}}})
        );
    }

    #[test]
    fn arrays_and_scalars_replace() {
        let base = json!({"labels": ["a", "b", "c"], "n": 1, "o": {"k": 1}});
        let patch = json!({"labels": ["z"], "n": "text", "o": [1]});
        assert_eq!(merged(base, patch), json!({"labels": ["z"], "n": "text", "o": [1]}));
        // A scalar over an object replaces the object, and an object over a scalar replaces it.
        assert_eq!(merged(json!({"k": {"a": 1}}), json!({"k": 5})), json!({"k": 5}));
        assert_eq!(merged(json!({"k": 5}), json!({"k": {"a": 1}})), json!({"k": {"a": 1}}));
    }

    #[test]
    fn explicit_null_sets_null() {
        let base = json!({"a": 1, "m": {"x": 1, "y": 2}});
        let patch = json!({"a": null, "m": {"x": null}, "n": null});
        assert_eq!(merged(base, patch), json!({"a": null, "m": {"x": null, "y": 2}, "n": null}));
        assert_eq!(merged(json!({"m": {"x": 1}}), json!({"m": null})), json!({"m": null}));
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z]{0,4}".prop_map(Value::from),
            prop::collection::vec(any::<i32>().prop_map(Value::from), 0..3).prop_map(Value::from),
        ]
    }

    /// Any JSON object: a key may hold an object in one value and a scalar in another.
    fn any_object() -> impl Strategy<Value = Value> {
        let value = leaf().prop_recursive(3, 24, 4, |inner| {
            prop::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        });
        prop::collection::btree_map("[a-d]", value, 0..5)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    /// Objects in which keys starting with `o` always hold objects and all other keys hold
    /// leaves (null, scalars, arrays): the shape of real config files, where a path is a
    /// section in every file or a value in every file.
    fn shaped_object() -> impl Strategy<Value = Value> {
        let leaves = prop::collection::btree_map("[a-c]", leaf(), 0..3);
        leaves
            .prop_recursive(3, 24, 3, |inner| {
                (
                    prop::collection::btree_map("[a-c]", leaf(), 0..3),
                    prop::collection::btree_map("o[a-b]", inner, 0..2),
                )
                    .prop_map(|(mut leaves, objects)| {
                        leaves.extend(
                            objects
                                .into_iter()
                                .map(|(k, v)| (k, Value::Object(v.into_iter().collect()))),
                        );
                        leaves.into_iter().collect()
                    })
            })
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest! {
        /// Invariant: an empty object is a two-sided identity of merge.
        #[test]
        fn merging_with_empty_object_is_identity(a in any_object()) {
            prop_assert_eq!(merged(a.clone(), json!({})), a.clone());
            prop_assert_eq!(merged(json!({}), a.clone()), a);
        }

        /// Invariant: merge is associative for objects whose paths agree on being sections.
        /// (Where one file has a scalar and the others an object at the same path, replace
        /// semantics make the grouping matter: `{k:{a}} ⊕ ({k:1} ⊕ {k:{b}})` keeps `a`.)
        #[test]
        fn merge_is_associative_for_objects(a in shaped_object(), b in shaped_object(), c in shaped_object()) {
            let left = merged(merged(a.clone(), b.clone()), c.clone());
            let right = merged(a, merged(b, c));
            prop_assert_eq!(left, right);
        }

        /// Invariant: merging a value with itself changes nothing.
        #[test]
        fn merge_is_idempotent(a in any_object()) {
            prop_assert_eq!(merged(a.clone(), a.clone()), a);
        }

        /// Invariant: every key of the patch ends up in the result with the patch's value
        /// when that value is not an object.
        #[test]
        fn patch_leaves_win(a in any_object(), b in any_object()) {
            let out = merged(a, b.clone());
            for (k, v) in b.as_object().unwrap() {
                if !v.is_object() {
                    prop_assert_eq!(&out[k], v);
                }
            }
        }
    }

    #[test]
    fn read_merged_reports_file_line_and_column() {
        let dir = std::env::temp_dir().join(format!("hangar-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SETTINGS_FILE), "{\"a\": 1}").unwrap();
        std::fs::write(dir.join(LOCAL_FILE), "{\n  \"a\": 2,\n  \"b\": ,\n}").unwrap();
        match read_merged(&dir).unwrap_err() {
            ConfigError::Parse { path, line, column, .. } => {
                assert_eq!(path, dir.join(LOCAL_FILE));
                assert_eq!((line, column), (3, 8));
            }
            other => panic!("unexpected {other:?}"),
        }
        std::fs::remove_file(dir.join(LOCAL_FILE)).unwrap();
        assert_eq!(read_merged(&dir).unwrap(), json!({"a": 1}));
        std::fs::remove_file(dir.join(SETTINGS_FILE)).unwrap();
        assert!(matches!(read_merged(&dir), Err(ConfigError::Read { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
