//! [`Secret`]: a config string that never shows up in output.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize, Serializer};

/// What a [`Secret`] prints and serializes as.
pub const REDACTED: &str = "<redacted>";

/// A secret string (an API key). Its `Debug`, `Display` and `Serialize` show
/// [`REDACTED`], so definitions and effective configs can be printed and served safely;
/// [`Secret::expose`] gives the value to the code that needs it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl JsonSchema for Secret {
    fn schema_name() -> Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "writeOnly": true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s: Secret = serde_json::from_str("\"sk-123\"").unwrap();
        assert_eq!(s.expose(), "sk-123");
        assert_eq!(format!("{s} {s:?}"), "<redacted> <redacted>");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"<redacted>\"");
    }
}
