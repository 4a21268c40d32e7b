//! The caps of `limits` on the lists of one inference request: chat `messages`, Responses
//! `input` items, embedding `input`s, rerank `documents`, `tools` and `stop` sequences (the
//! Messages API's `messages`, `tools` and `stop_sequences` alike).
//!
//! They are checked first in every inference handler, on the raw body, for models whose
//! engine takes typed requests and for those whose engine the body is forwarded to alike:
//! before the body is parsed into its typed request (which would build every element) and
//! before anything is admitted or loaded. A crossed cap is 400 `limit_exceeded` naming the
//! field, its size and the limit.
//!
//! The pass reads only the capped top-level fields, as raw JSON, and counts their elements
//! without building them. It never refuses a body for its shape: a body that is not a JSON
//! object, or a field of the wrong type, is left to the typed parser, which refuses it with
//! its precise error (a forwarding engine gets it as sent, one element at most).

use std::fmt;

use hangar_config::Limits;
use hangar_runtime::engine::ForwardRoute;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::Recorder;
use crate::error::{ApiError, HttpCode};
use crate::router::Ctx;

/// The top-level fields this module reads.
const READ: [&str; 7] =
    ["model", "messages", "input", "documents", "tools", "stop", "stop_sequences"];

/// The fields of [`READ`] a body holds, as raw JSON, in body order (a key sent twice is
/// there twice: each occurrence is checked).
struct Fields<'a>(Vec<(&'static str, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match READ.iter().find(|&&name| name == key) {
                Some(&name) => fields.push((name, map.next_value::<&'de RawValue>()?)),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Fields(fields))
    }
}

/// Elements of a JSON array, counted without building them; `None` for anything else.
fn items(raw: &RawValue) -> Option<usize> {
    // `IgnoredAny` is zero-sized: the vector never allocates.
    serde_json::from_str::<Vec<IgnoredAny>>(raw.get()).ok().map(|v| v.len())
}

/// A JSON string's length in UTF-8 bytes once unescaped; `None` for anything else.
fn string_bytes(raw: &RawValue) -> Option<usize> {
    serde_json::from_str::<String>(raw.get()).ok().map(|s| s.len())
}

fn exceeded(field: &str, message: String) -> ApiError {
    ApiError::new(HttpCode::LimitExceeded, message).with_field(field)
}

/// Refuses a list over its cap: `field` has `n` items, the cap is `limit` (`key` names it).
fn check_items(field: &str, n: usize, limit: u32, key: &str) -> Result<(), ApiError> {
    if n <= limit as usize {
        return Ok(());
    }
    Err(exceeded(
        field,
        format!("`{field}` has {n} items; the limit is {limit} (limits.{key}); nothing was run"),
    ))
}

/// Refuses stop sequences over their count or a stop sequence over its length.
fn check_stop(field: &str, raw: &RawValue, limits: &Limits) -> Result<(), ApiError> {
    let max_bytes = limits.max_stop_sequence_bytes.get();
    let check_one = |name: &str, bytes: usize| {
        if bytes <= max_bytes as usize {
            return Ok(());
        }
        Err(exceeded(
            field,
            format!(
                "`{name}` is {bytes} bytes; the limit is {max_bytes} (limits.max_stop_sequence_bytes); nothing was run"
            ),
        ))
    };
    if let Some(bytes) = string_bytes(raw) {
        return check_one(field, bytes);
    }
    let Some(n) = items(raw) else { return Ok(()) };
    check_items(field, n, limits.max_stop_sequences.get(), "max_stop_sequences")?;
    // At most `max_stop_sequences` elements, each read on its own.
    let elements: Vec<&RawValue> = serde_json::from_str(raw.get()).unwrap_or_default();
    for (i, element) in elements.iter().enumerate() {
        if let Some(bytes) = string_bytes(element) {
            check_one(&format!("{field}[{i}]"), bytes)?;
        }
    }
    Ok(())
}

/// Checks one field of a `route` body against `limits`.
fn check_field(
    route: ForwardRoute,
    name: &str,
    raw: &RawValue,
    limits: &Limits,
) -> Result<(), ApiError> {
    use ForwardRoute::*;
    let count = || items(raw);
    match (route, name) {
        (ChatCompletions, "messages") => count().map_or(Ok(()), |n| {
            check_items("messages", n, limits.max_messages.get(), "max_messages")
        }),
        (Responses, "input") => count()
            .map_or(Ok(()), |n| check_items("input", n, limits.max_messages.get(), "max_messages")),
        (Embeddings, "input") => count().map_or(Ok(()), |n| {
            check_items("input", n, limits.max_embedding_inputs.get(), "max_embedding_inputs")
        }),
        (Rerank, "documents") => count().map_or(Ok(()), |n| {
            check_items("documents", n, limits.max_rerank_documents.get(), "max_rerank_documents")
        }),
        (ChatCompletions | Responses, "tools") => {
            count().map_or(Ok(()), |n| check_items("tools", n, limits.max_tools.get(), "max_tools"))
        }
        (ChatCompletions | Completions, "stop") => check_stop("stop", raw, limits),
        _ => Ok(()),
    }
}

/// Checks one field of a Messages API body: `messages`, `tools` and `stop_sequences`.
fn check_messages_field(name: &str, raw: &RawValue, limits: &Limits) -> Result<(), ApiError> {
    let count = || items(raw);
    match name {
        "messages" => count().map_or(Ok(()), |n| {
            check_items("messages", n, limits.max_messages.get(), "max_messages")
        }),
        "tools" => {
            count().map_or(Ok(()), |n| check_items("tools", n, limits.max_tools.get(), "max_tools"))
        }
        "stop_sequences" => check_stop("stop_sequences", raw, limits),
        _ => Ok(()),
    }
}

/// Refuses a `route` body whose lists cross the configured `limits`, before anything else
/// reads it; names the request's model in its metrics when the body names a configured one.
///
/// # Errors
/// 400 `limit_exceeded` naming the field, its size and the limit.
pub(crate) fn check(ctx: &Ctx, rec: &mut Recorder, route: ForwardRoute) -> Result<(), ApiError> {
    check_with(ctx, rec, |name, raw, limits| check_field(route, name, raw, limits))
}

/// [`check`] for the Messages API's bodies.
///
/// # Errors
/// As [`check`].
pub(crate) fn check_messages(ctx: &Ctx, rec: &mut Recorder) -> Result<(), ApiError> {
    check_with(ctx, rec, check_messages_field)
}

fn check_with(
    ctx: &Ctx,
    rec: &mut Recorder,
    field: impl Fn(&str, &RawValue, &Limits) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    // Not an object, or not JSON: the typed parser says what is wrong.
    let Ok(Fields(fields)) = serde_json::from_slice::<Fields<'_>>(&ctx.body) else {
        return Ok(());
    };
    let limits = &ctx.state.options.limits;
    let checked: Result<(), ApiError> = fields
        .iter()
        .filter(|(name, _)| *name != "model")
        .try_for_each(|(name, raw)| field(name, raw, limits));
    if checked.is_err() {
        let model = fields.iter().find(|(name, _)| *name == "model");
        if let Some(model) = model.and_then(|(_, raw)| serde_json::from_str(raw.get()).ok()) {
            // Labels the metrics when the model is configured; an unknown one stays unknown.
            let _ = rec.model(Some(model));
        }
    }
    checked
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use serde_json::{Value, json};

    use super::*;

    fn limits() -> Limits {
        let n = |v| NonZeroU32::new(v).unwrap();
        Limits {
            max_embedding_inputs: n(3),
            max_rerank_documents: n(3),
            max_stop_sequences: n(2),
            max_stop_sequence_bytes: n(4),
            max_messages: n(2),
            max_tools: n(1),
            ..Limits::default()
        }
    }

    /// The error of `body` on `route` under [`limits`]: `None` when it passes, else its field
    /// and message.
    fn verdict(route: ForwardRoute, body: &Value) -> Option<(String, String)> {
        verdict_of(route, &body.to_string())
    }

    fn verdict_of(route: ForwardRoute, body: &str) -> Option<(String, String)> {
        let Fields(fields) = serde_json::from_str::<Fields<'_>>(body).unwrap();
        let limits = limits();
        let error = fields
            .iter()
            .filter(|(name, _)| *name != "model")
            .try_for_each(|(name, raw)| check_field(route, name, raw, &limits))
            .err()?;
        assert_eq!(error.code, HttpCode::LimitExceeded);
        Some((error.field.unwrap(), error.message))
    }

    #[test]
    fn each_list_passes_at_its_cap_and_is_refused_one_over() {
        use ForwardRoute::*;
        let list = |n: usize| Value::from(vec![json!({ "role": "user" }); n]);
        let cases = [
            (ChatCompletions, "messages", 2, "limits.max_messages"),
            (Responses, "input", 2, "limits.max_messages"),
            (Embeddings, "input", 3, "limits.max_embedding_inputs"),
            (Rerank, "documents", 3, "limits.max_rerank_documents"),
            (ChatCompletions, "tools", 1, "limits.max_tools"),
            (Responses, "tools", 1, "limits.max_tools"),
            (ChatCompletions, "stop", 2, "limits.max_stop_sequences"),
            (Completions, "stop", 2, "limits.max_stop_sequences"),
        ];
        for (route, field, cap, key) in cases {
            assert_eq!(verdict(route, &json!({ field: list(cap) })), None, "{route:?} {field}");
            let (named, message) = verdict(route, &json!({ field: list(cap + 1) }))
                .unwrap_or_else(|| panic!("{route:?} {field}: {} passed", cap + 1));
            assert_eq!(named, field);
            let expected = format!("`{field}` has {} items; the limit is {cap} ({key})", cap + 1);
            assert!(message.starts_with(&expected), "{message}");
        }
    }

    #[test]
    fn stop_sequences_are_capped_in_bytes_once_unescaped() {
        let route = ForwardRoute::ChatCompletions;
        assert_eq!(verdict(route, &json!({ "stop": "abcd" })), None);
        // Four bytes written as 24 characters of escapes; four bytes in two characters.
        let escaped = r#"{ "stop": ["\u0041\u0042\u0043\u0044", "éé"] }"#;
        assert_eq!(verdict_of(route, escaped), None);
        let (field, message) = verdict(route, &json!({ "stop": "abcde" })).unwrap();
        assert_eq!(field, "stop");
        assert!(message.starts_with("`stop` is 5 bytes; the limit is 4"), "{message}");
        let (_, message) = verdict(route, &json!({ "stop": ["ok", "€€"] })).unwrap();
        assert!(message.starts_with("`stop[1]` is 6 bytes"), "{message}");
    }

    #[test]
    fn other_routes_fields_and_shapes_are_left_alone() {
        use ForwardRoute::*;
        let many = Value::from(vec![json!("x"); 100]);
        // Lists a route does not cap, or that are not lists: the typed parser decides.
        for (route, body) in [
            (Embeddings, json!({ "messages": many, "tools": many, "stop": many })),
            (Completions, json!({ "prompt": many, "input": many })),
            (Rerank, json!({ "input": many })),
            (Responses, json!({ "stop": many, "input": "one long string" })),
            (ChatCompletions, json!({ "messages": "not a list", "tools": { "a": 1 } })),
            (Embeddings, json!({ "input": "one text" })),
        ] {
            assert_eq!(verdict(route, &body), None, "{route:?} {body}");
        }
        // A key sent twice is checked each time.
        let twice = r#"{ "tools": [], "tools": [1, 2] }"#.as_bytes();
        let Fields(fields) = serde_json::from_slice::<Fields<'_>>(twice).unwrap();
        assert_eq!(fields.len(), 2);
        // Not an object: nothing to read.
        assert!(serde_json::from_slice::<Fields<'_>>(b"[1, 2]").is_err());
    }
}
