//! [`ServedName`]: another name a model is served under (its `aliases`), and the rule that
//! no name is claimed by two models.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::validate::ValidationError;
use crate::{ModelConfig, ModelName};

/// The longest served name accepted, in bytes.
pub const MAX_SERVED_NAME_LEN: usize = 256;

/// A name a model is also served under, in request bodies and (percent-encoded) in paths.
///
/// Unlike a [`ModelName`] it may contain `/`, as KServe's `publishers/<ns>/models/<name>`
/// does: it is never a file name. It is non-empty, at most [`MAX_SERVED_NAME_LEN`] bytes,
/// without control characters, `\`, `,` or surrounding whitespace, does not start with `-`
/// (it could pass for a flag where it reaches a command line), and every part between
/// slashes is non-empty and neither `.` nor `..`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ServedName(Arc<str>);

impl ServedName {
    /// Validates `name` and wraps it.
    ///
    /// # Errors
    /// The first rule `name` breaks, in words.
    pub fn new(name: impl Into<String>) -> Result<Self, String> {
        let name = name.into();
        if name.is_empty() {
            return Err("must not be empty".into());
        }
        if name.len() > MAX_SERVED_NAME_LEN {
            return Err(format!(
                "is {} bytes long; at most {MAX_SERVED_NAME_LEN} are allowed",
                name.len()
            ));
        }
        if name.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        if name.contains('\\') {
            return Err("must not contain \"\\\"".into());
        }
        if name.trim() != name {
            return Err("must not start or end with whitespace".into());
        }
        if name.starts_with('-') {
            return Err(
                "must not start with \"-\" (it would read as a flag on an engine's command line)"
                    .into(),
            );
        }
        if name.contains(',') {
            return Err("must not contain \",\" (lists of served names are separated by it)".into());
        }
        if name.split('/').any(|part| matches!(part, "" | "." | "..")) {
            return Err("every part between slashes must be non-empty and not . or ..".into());
        }
        Ok(Self(name.into()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One error for each name (a model's name or one of its aliases) that two or more models
/// claim, naming them all.
pub(crate) fn claimed_twice(models: &[ModelConfig]) -> Vec<ValidationError> {
    let mut claims: BTreeMap<&str, Vec<&ModelName>> = BTreeMap::new();
    for model in models {
        claims.entry(model.name.as_str()).or_default().push(&model.name);
        for alias in &model.aliases {
            let owners = claims.entry(alias.as_str()).or_default();
            if !owners.contains(&&model.name) {
                owners.push(&model.name);
            }
        }
    }
    claims
        .into_iter()
        .filter(|(_, owners)| owners.len() > 1)
        .map(|(name, owners)| {
            let owners: Vec<String> = owners.iter().map(|o| format!("`{o}`")).collect();
            ValidationError {
                path: "models".into(),
                message: format!(
                    "the name `{name}` is claimed by more than one model: {}",
                    owners.join(" and ")
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::ServedName;
    use crate::{Config, ConfigError};

    fn errors(settings: serde_json::Value) -> Vec<String> {
        match Config::from_value(&settings) {
            Err(ConfigError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect(),
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn a_name_two_models_claim_is_an_error_naming_both_and_aliases_are_checked() {
        let alias = "publishers/default/models/chat";
        let both = json!({ "models": {
            "chat": { "backend": "stub", "aliases": [alias] },
            "other": { "backend": "stub", "aliases": [alias, "chat"] },
        } });
        let errors = errors(both);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.contains("`chat` is claimed") && e.contains("`other`")));
        assert!(errors.iter().any(|e| e.contains(alias) && e.contains("`chat` and `other`")));
        let bad =
            json!({ "models": { "m": { "backend": "stub", "aliases": ["a//b", "x", "x"] } } });
        let errors = super::tests::errors(bad);
        assert!(
            errors.iter().any(|e| e.contains("aliases[0]") && e.contains("non-empty")),
            "{errors:?}"
        );
        assert!(errors.iter().any(|e| e.contains("aliases[2]") && e.contains("listed twice")));
        let fine = json!({ "models": { "m": { "backend": "stub", "aliases": [alias] } } });
        let config = Config::from_value(&fine).unwrap();
        assert_eq!(config.models[0].aliases[0].as_str(), alias);
        assert_eq!(config.models[0].definition()["aliases"], json!([alias]));
    }

    #[test]
    fn a_served_name_may_hold_slashes_but_no_empty_or_dot_parts() {
        for ok in ["chat", "publishers/default/models/chat", "org/model:7b", "a.b/c-d_e"] {
            assert_eq!(ServedName::new(ok).unwrap().as_str(), ok);
        }
        let long = "x".repeat(257);
        for bad in ["", "/chat", "chat/", "a//b", "a/./b", "../b", "a\\b", " a", "a\n", &long] {
            assert!(ServedName::new(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(ServedName::new("x".repeat(256)).is_ok(), "at the limit");
    }

    #[test]
    fn a_configured_alias_that_reads_as_a_flag_or_splits_a_list_is_a_config_error() {
        let flags = json!({ "models": { "m": { "backend": "stub",
            "aliases": ["--trust-remote-code", "-x", "a,b", "ok-"] } } });
        let errors = errors(flags);
        assert_eq!(errors.len(), 3, "{errors:?}");
        for (i, why) in [(0, "start with \"-\""), (1, "start with \"-\""), (2, "\",\"")] {
            let at = format!("aliases[{i}]");
            assert!(errors.iter().any(|e| e.contains(&at) && e.contains(why)), "{errors:?}");
        }
        let name = json!({ "models": { "--api-key": { "backend": "stub" } } });
        assert!(super::tests::errors(name).iter().any(|e| e.contains("start with \"-\"")));
    }
}
