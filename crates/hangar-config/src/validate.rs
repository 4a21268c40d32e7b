//! Validation machinery: JSON paths, collected problems, per-key checks and suggestions.
//!
//! Validation never stops at the first problem: every field of every model is checked and
//! each problem is reported with its JSON path (`models.qwen.gguf_n_ctx: must be >= 1`).

use std::fmt;
use std::sync::LazyLock;

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::kinds::BackendKind;
use crate::sections::Section;

/// One problem found in a config, at a JSON path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ValidationError {
    /// Dotted path of the offending value (`models.qwen.gguf_n_ctx`); keys that are not
    /// plain identifiers are bracketed: `models["mistral-3.2"].replicas`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Appends `key` to a JSON path.
pub(crate) fn join_path(base: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$');
    match (base.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (true, false) => format!("[{key:?}]"),
        (false, true) => format!("{base}.{key}"),
        (false, false) => format!("{base}[{key:?}]"),
    }
}

/// The problems found so far, and the path they are relative to.
pub(crate) struct Problems<'a> {
    base: String,
    errors: &'a mut Vec<ValidationError>,
}

impl<'a> Problems<'a> {
    pub(crate) fn new(base: String, errors: &'a mut Vec<ValidationError>) -> Self {
        Self { base, errors }
    }

    /// Problems under `base.field`.
    pub(crate) fn nested(&mut self, field: &str) -> Problems<'_> {
        Problems { base: join_path(&self.base, field), errors: self.errors }
    }

    /// All problems collected so far, for checks that run their own validation.
    pub(crate) fn errors_mut(&mut self) -> &mut Vec<ValidationError> {
        self.errors
    }

    /// A problem with item `index` of the list `field` (`base.field[index]`).
    pub(crate) fn push_item(&mut self, field: &str, index: usize, message: impl Into<String>) {
        let path = format!("{}[{index}]", join_path(&self.base, field));
        self.errors.push(ValidationError { path, message: message.into() });
    }

    pub(crate) fn push(&mut self, field: &str, message: impl Into<String>) {
        self.errors
            .push(ValidationError { path: join_path(&self.base, field), message: message.into() });
    }

    pub(crate) fn at_least<T: PartialOrd + fmt::Display>(
        &mut self,
        field: &str,
        v: Option<T>,
        min: T,
    ) {
        if v.is_some_and(|v| v < min) {
            self.push(field, format!("must be >= {min}"));
        }
    }

    pub(crate) fn within<T: PartialOrd + fmt::Display>(
        &mut self,
        field: &str,
        v: Option<T>,
        lo: T,
        hi: T,
    ) {
        if v.is_some_and(|v| v < lo || v > hi) {
            self.push(field, format!("must be between {lo} and {hi}"));
        }
    }

    pub(crate) fn non_empty(&mut self, field: &str, v: Option<&str>) {
        if v.is_some_and(|v| v.trim().is_empty()) {
            self.push(field, "must not be empty");
        }
    }

    /// Rejects extra command-line arguments that Hangar sets itself.
    pub(crate) fn managed_args(&mut self, field: &str, args: Option<&[String]>, managed: &[&str]) {
        for (i, arg) in args.unwrap_or_default().iter().enumerate() {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
            if managed.contains(&flag) {
                self.nested(field).push(
                    &i.to_string(),
                    format!(
                        "`{flag}` is managed by Hangar and cannot be passed as an extra argument"
                    ),
                );
            }
        }
    }
}

/// What the validator knows about one [`Section`] type.
pub(crate) struct SectionMeta {
    /// Backends whose models may use these fields.
    pub(crate) backends: &'static [BackendKind],
    /// Field names, in declaration order.
    pub(crate) fields: Vec<String>,
    /// JSON Schema of each field, by name.
    pub(crate) properties: Map<String, Value>,
    check_key: fn(&str, &Value) -> Result<(), String>,
}

impl SectionMeta {
    pub(crate) fn of<T: Section>() -> Self {
        let properties = schema_properties::<T>();
        Self {
            backends: T::BACKENDS,
            fields: properties.keys().cloned().collect(),
            properties,
            check_key: check_key::<T>,
        }
    }

    pub(crate) fn has(&self, field: &str) -> bool {
        self.fields.iter().any(|f| f == field)
    }

    /// Checks that `value` has the right type for `field`.
    pub(crate) fn check_key(&self, field: &str, value: &Value) -> Result<(), String> {
        (self.check_key)(field, value)
    }
}

/// The JSON Schema of `T` with every subschema inlined.
pub(crate) fn inline_schema<T: JsonSchema>() -> Map<String, Value> {
    let schema = SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>();
    match schema.to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn schema_properties<T: JsonSchema>() -> Map<String, Value> {
    match inline_schema::<T>().remove("properties") {
        Some(Value::Object(props)) => props,
        _ => Map::new(),
    }
}

/// Parses a one-key object into `T`, so the error (if any) is about that key alone.
fn check_key<T: DeserializeOwned>(field: &str, value: &Value) -> Result<(), String> {
    let single = Map::from_iter([(field.to_owned(), value.clone())]);
    serde_json::from_value::<T>(Value::Object(single))
        .map(drop)
        .map_err(|e| humanize(&e.to_string()))
}

/// serde's words for JSON types ("sequence", "map") in JSON's own terms.
pub(crate) fn humanize(message: &str) -> String {
    message
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: map", "invalid type: object")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected an object")
}

/// The closest candidate to an unknown `key`, if one is close enough to be a typo.
pub(crate) fn did_you_mean<'c>(
    key: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    let limit = (key.chars().count() / 4).max(2);
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(key, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The message for a key no section knows.
pub(crate) fn unknown_field<'c>(
    key: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> String {
    match did_you_mean(key, candidates) {
        Some(best) => format!("unknown field; did you mean `{best}`?"),
        None => "unknown field".to_owned(),
    }
}

/// A short name for the JSON type of `v`, for messages ("a string", "an array", …).
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A key whose value is itself an object validated key by key (its own section).
pub(crate) type NestedCheck = (&'static str, fn(&Value, &str, &mut Vec<ValidationError>));

/// Checks every key of `obj` against section `T`: unknown keys (with a suggestion) and
/// values of the wrong type. Keys listed in `nested` are checked by their own function.
pub(crate) fn check_keys<T: Section>(
    obj: &Map<String, Value>,
    path: &str,
    nested: &[NestedCheck],
    errors: &mut Vec<ValidationError>,
) {
    let meta = SectionMeta::of::<T>();
    for (key, v) in obj {
        let key_path = join_path(path, key);
        if let Some((_, check)) = nested.iter().find(|(k, _)| k == key).filter(|_| v.is_object()) {
            check(v, &key_path, errors);
        } else if !meta.has(key) {
            let message = unknown_field(key, meta.fields.iter().map(String::as_str));
            errors.push(ValidationError { path: key_path, message });
        } else if let Err(message) = meta.check_key(key, v) {
            errors.push(ValidationError { path: key_path, message });
        }
    }
}

/// Validates an object whose keys all belong to section `T` and parses it.
///
/// Returns `None` when anything was wrong; every problem is in `errors`.
pub(crate) fn parse_flat<T: Section>(
    value: &Value,
    path: &str,
    nested: &[NestedCheck],
    errors: &mut Vec<ValidationError>,
) -> Option<T> {
    let Some(obj) = value.as_object() else {
        errors.push(ValidationError {
            path: path.to_owned(),
            message: format!("expected an object, got {}", json_kind(value)),
        });
        return None;
    };
    let before = errors.len();
    check_keys::<T>(obj, path, nested, errors);
    if errors.len() > before {
        return None;
    }
    let parsed: T = serde_json::from_value(value.clone()).ok()?;
    parsed.check(&mut Problems::new(path.to_owned(), errors));
    (errors.len() == before).then_some(parsed)
}

/// Checks the keys of a nested object that belongs to section `T`.
pub(crate) fn check_nested<T: Section>(
    value: &Value,
    path: &str,
    errors: &mut Vec<ValidationError>,
) {
    if let Some(obj) = value.as_object() {
        check_keys::<T>(obj, path, &[], errors);
    }
}

/// Metadata of every model-level section, common fields first.
pub(crate) static MODEL_SECTIONS: LazyLock<Vec<SectionMeta>> = LazyLock::new(|| {
    use crate::model::ModelFields;
    use crate::sections::*;
    vec![
        SectionMeta::of::<ModelFields>(),
        SectionMeta::of::<LlamaCppSettings>(),
        SectionMeta::of::<LlamaServerSettings>(),
        SectionMeta::of::<VllmSettings>(),
        SectionMeta::of::<VllmServeSettings>(),
        SectionMeta::of::<ExllamaSettings>(),
        SectionMeta::of::<BridgeSettings>(),
        SectionMeta::of::<Ct2Settings>(),
        SectionMeta::of::<OpenAiRemoteSettings>(),
        SectionMeta::of::<StubSection>(),
    ]
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_bracket_keys_that_are_not_identifiers() {
        assert_eq!(join_path("", "models"), "models");
        assert_eq!(join_path("models", "qwen"), "models.qwen");
        assert_eq!(join_path("models", "mistral-3.2"), "models[\"mistral-3.2\"]");
        assert_eq!(join_path("models[\"a.b\"]", "replicas"), "models[\"a.b\"].replicas");
        assert_eq!(join_path("x", "0"), "x.0");
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let fields = ["gguf_n_ctx", "gguf_n_gpu_layers", "replicas", "model_path"];
        assert_eq!(did_you_mean("gguf_nctx", fields), Some("gguf_n_ctx"));
        assert_eq!(did_you_mean("replica", fields), Some("replicas"));
        assert_eq!(did_you_mean("modle_path", fields), Some("model_path"));
        assert_eq!(did_you_mean("temperature", fields), None);
    }

    #[test]
    fn every_model_field_belongs_to_exactly_one_section() {
        let mut seen = std::collections::BTreeMap::new();
        for (i, section) in MODEL_SECTIONS.iter().enumerate() {
            assert!(!section.fields.is_empty(), "section {i} has no fields");
            for field in &section.fields {
                assert_eq!(seen.insert(field.clone(), i), None, "`{field}` is in two sections");
            }
        }
    }

    #[test]
    fn backend_fields_carry_their_backend_prefix() {
        for section in MODEL_SECTIONS.iter().skip(1) {
            for field in &section.fields {
                let ok = [
                    "gguf_",
                    "llama_server_",
                    "vllm_",
                    "exllama_",
                    "bridge_",
                    "ct2_",
                    "openai_",
                    "stub",
                ]
                .iter()
                .any(|p| field.starts_with(p));
                assert!(ok, "`{field}` does not say which backend it is for");
            }
        }
    }
}
