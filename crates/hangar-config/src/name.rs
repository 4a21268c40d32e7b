//! [`ModelName`]: the validated name of a configured model.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

/// The longest model name accepted, in bytes.
pub const MAX_MODEL_NAME_LEN: usize = 128;

/// The name of a configured model, as it appears in `settings.json` and in URLs.
///
/// A name is non-empty, at most [`MAX_MODEL_NAME_LEN`] bytes, has no surrounding whitespace,
/// and contains no `/`, `\`, `..` or control characters, so it can never climb out of a
/// directory or split a URL path segment. It does not start with `-` (engines get it on
/// their command line, where it could pass for a flag) and holds no `,` (lists of served
/// names join with it). Clones share the string.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ModelName(Arc<str>);

/// Why a string is not a valid [`ModelName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelNameError {
    /// The name is the empty string.
    #[error("model name must not be empty")]
    Empty,
    /// The name is longer than [`MAX_MODEL_NAME_LEN`] bytes.
    #[error("model name is {len} bytes long; at most {MAX_MODEL_NAME_LEN} are allowed")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
    },
    /// The name contains a path separator (`/` or `\`).
    #[error("model name must not contain {0:?}")]
    PathSeparator(char),
    /// The name contains `..`.
    #[error("model name must not contain \"..\"")]
    DotDot,
    /// The name contains a control character.
    #[error("model name must not contain control characters")]
    ControlCharacter,
    /// The name starts or ends with whitespace.
    #[error("model name must not start or end with whitespace")]
    SurroundingWhitespace,
    /// The name starts with `-`, as a command-line flag does.
    #[error(
        "model name must not start with \"-\" (it would read as a flag on an engine's command line)"
    )]
    LeadingDash,
    /// The name contains `,`, which separates names in lists of them.
    #[error("model name must not contain \",\" (lists of served names are separated by it)")]
    Comma,
}

impl ModelName {
    /// Validates `name` and wraps it.
    ///
    /// # Errors
    /// Returns the first rule `name` breaks (see the type's documentation).
    pub fn new(name: impl Into<String>) -> Result<Self, ModelNameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ModelNameError::Empty);
        }
        if name.len() > MAX_MODEL_NAME_LEN {
            return Err(ModelNameError::TooLong { len: name.len() });
        }
        if let Some(sep) = name.chars().find(|c| matches!(c, '/' | '\\')) {
            return Err(ModelNameError::PathSeparator(sep));
        }
        if name.contains("..") {
            return Err(ModelNameError::DotDot);
        }
        if name.chars().any(char::is_control) {
            return Err(ModelNameError::ControlCharacter);
        }
        if name.trim() != name {
            return Err(ModelNameError::SurroundingWhitespace);
        }
        if name.starts_with('-') {
            return Err(ModelNameError::LeadingDash);
        }
        if name.contains(',') {
            return Err(ModelNameError::Comma);
        }
        Ok(Self(name.into()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ModelName {
    type Err = ModelNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for ModelName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ModelName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de> Deserialize<'de> for ModelName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::new(raw).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ModelName {
    fn schema_name() -> Cow<'static, str> {
        "ModelName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_MODEL_NAME_LEN,
            "pattern": "^[^/\\\\\\p{Cc}\\s,-](?:[^/\\\\\\p{Cc},]*[^/\\\\\\p{Cc}\\s,])?$",
            "description": "Model name: no '/', '\\\\', ',', '..', control characters or surrounding whitespace; not starting with '-'."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: Result<(), ModelNameError>) {
        assert_eq!(ModelName::new(name).map(|_| ()), expected, "name {name:?}");
    }

    #[test]
    fn accepts_ordinary_names() {
        for name in
            ["qwen3-8b", "google_gemma-4-E2B-it-Q8_0-gguf", "mistral-small-3.2", "a", "qwen3:8b"]
        {
            check(name, Ok(()));
        }
        check(&"x".repeat(MAX_MODEL_NAME_LEN), Ok(()));
    }

    #[test]
    fn rejects_path_traversal() {
        check("..", Err(ModelNameError::DotDot));
        check("../etc/passwd", Err(ModelNameError::PathSeparator('/')));
        check("..%2fetc", Err(ModelNameError::DotDot));
        check("a/b", Err(ModelNameError::PathSeparator('/')));
        check("..\\windows", Err(ModelNameError::PathSeparator('\\')));
        check("models..bak", Err(ModelNameError::DotDot));
    }

    #[test]
    fn rejects_empty_long_control_and_padded_names() {
        check("", Err(ModelNameError::Empty));
        check(&"x".repeat(MAX_MODEL_NAME_LEN + 1), Err(ModelNameError::TooLong { len: 129 }));
        check("a\nb", Err(ModelNameError::ControlCharacter));
        check("a\u{0}b", Err(ModelNameError::ControlCharacter));
        check(" qwen", Err(ModelNameError::SurroundingWhitespace));
        check("qwen ", Err(ModelNameError::SurroundingWhitespace));
    }

    #[test]
    fn rejects_names_that_read_as_flags_or_split_lists() {
        check("--trust-remote-code", Err(ModelNameError::LeadingDash));
        check("-m", Err(ModelNameError::LeadingDash));
        check("a,b", Err(ModelNameError::Comma));
        check("qwen3-8b-", Ok(()));
    }

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<ModelName>("\"ok\"").is_ok());
        let err = serde_json::from_str::<ModelName>("\"a/b\"").unwrap_err();
        assert!(err.to_string().contains("must not contain '/'"), "{err}");
    }
}
