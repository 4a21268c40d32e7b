//! Hangar's rules on a body forwarded to an engine that serves the OpenAI API itself
//! (`llama-server`, `vllm serve`, a remote server), checked before anything is admitted or
//! loaded. The caps of `limits` apply as on every route (`limits.rs`); these are the rules
//! Hangar's typed path enforces by construction, which a body passed through as sent would
//! otherwise skip:
//!
//! - `n` and `best_of` must be 1 (or absent): Hangar admits and counts one sequence per
//!   request; `n: 64` would run 64 on one slot's admission.
//! - Media named by URL (`image_url`, `video_url`, `audio_url`, `file_url` that are not
//!   `data:` URLs) are refused unless the model's `allow_remote_media` is on: the engine
//!   would fetch them itself, from this machine, inside its network.
//! - `id_slot` (llama-server: run in this slot) is refused: slots are shared by every client,
//!   and pinning one lets a request reuse or overwrite another client's cached prompt and
//!   defeats Hangar's placement.
//! - `chat_template` (vLLM: a Jinja template for this request) is refused: the template that
//!   runs in the engine is the model's, as configured, not one a client sends.
//!
//! Everything else is the engine's and passes unchanged. A body whose fields cannot be read
//! (a key given twice among these) is refused rather than guessed at.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{ApiError, RuntimeCode};

/// Keys whose value names a media item: a URL string, or an object with a `url`.
const MEDIA_KEYS: [&str; 4] = ["image_url", "video_url", "audio_url", "file_url"];

/// The fields these rules read; the rest is skipped unread.
#[derive(Deserialize)]
struct Fields<'a> {
    n: Option<Value>,
    best_of: Option<Value>,
    #[serde(borrow)]
    id_slot: Option<&'a RawValue>,
    #[serde(borrow)]
    chat_template: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

/// Checks a forwarded `body` against Hangar's rules; `remote_media` is the model's
/// `allow_remote_media`.
///
/// # Errors
/// 400 `invalid_request` naming the field.
pub(crate) fn check(body: &[u8], remote_media: bool) -> Result<(), ApiError> {
    let fields: Fields<'_> = serde_json::from_slice(body).map_err(|e| {
        refused("body", format!("the request body could not be read: {e}; nothing was run"))
    })?;
    for (name, value) in [("n", &fields.n), ("best_of", &fields.best_of)] {
        match value {
            None | Some(Value::Null) => {}
            Some(v) if v.as_f64() == Some(1.0) => {}
            Some(v) => {
                return Err(refused(
                    name,
                    format!(
                        "`{name}` must be 1 (got {v}); only one choice is supported: send \
                         one request per choice"
                    ),
                ));
            }
        }
    }
    if fields.id_slot.is_some() {
        return Err(refused(
            "id_slot",
            "`id_slot` is refused: Hangar places requests, and an engine's slots (with their \
             cached prompts) are shared by every client",
        ));
    }
    if fields.chat_template.is_some() {
        return Err(refused(
            "chat_template",
            "`chat_template` is refused: the model's own chat template, as configured, is the \
             one that runs",
        ));
    }
    if remote_media {
        return Ok(());
    }
    for (name, raw) in [("messages", fields.messages), ("input", fields.input)] {
        let Some(raw) = raw else { continue };
        // Most bodies name no media: only those that could are parsed (an escaped key, as
        // `image\u005furl`, could, so an escape is enough to look).
        let text = raw.get();
        if !text.contains("_url") && !text.contains("\\u") {
            continue;
        }
        if let Ok(value) = serde_json::from_str::<Value>(text)
            && let Some((path, url)) = remote_url(&value, name.to_owned())
        {
            let scheme = url.split_once(':').map_or("", |(s, _)| s);
            return Err(refused(
                &path,
                format!(
                    "`{path}` names a {scheme}: URL, which this model's engine would fetch \
                     from this machine; send it inline as a data: URL, or set the model's \
                     allow_remote_media"
                ),
            ));
        }
    }
    Ok(())
}

/// The first media URL under `value` that is not a `data:` URL, with its path.
fn remote_url(value: &Value, path: String) -> Option<(String, String)> {
    match value {
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, item)| remote_url(item, format!("{path}[{i}]")))
        }
        Value::Object(map) => map.iter().find_map(|(key, item)| {
            let here = format!("{path}.{key}");
            if MEDIA_KEYS.contains(&key.as_str()) {
                let (url, at) = match item {
                    Value::String(url) => (Some(url), here.clone()),
                    Value::Object(inner) => match inner.get("url") {
                        Some(Value::String(url)) => (Some(url), format!("{here}.url")),
                        _ => (None, here.clone()),
                    },
                    _ => (None, here.clone()),
                };
                if let Some(url) = url
                    && !is_data_url(url)
                {
                    return Some((at, url.clone()));
                }
            }
            remote_url(item, here)
        }),
        _ => None,
    }
}

/// Whether `url` carries its content inline (`data:`, any case, leading spaces ignored).
fn is_data_url(url: &str) -> bool {
    url.trim_start().get(..5).is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:"))
}

fn refused(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(RuntimeCode::InvalidRequest, message).with_field(field)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The refused field of `body` under `remote_media`, or `None` when it passes.
    fn refused_field(body: Value, remote_media: bool) -> Option<String> {
        check(body.to_string().as_bytes(), remote_media).err().map(|e| {
            assert_eq!(e.code, RuntimeCode::InvalidRequest);
            e.field.unwrap_or_default()
        })
    }

    fn user(content: Value) -> Value {
        json!({ "model": "m", "messages": [{ "role": "user", "content": content }] })
    }

    #[test]
    fn one_choice_only() {
        let cases = [
            (json!({ "n": 1 }), None),
            (json!({ "n": 1.0 }), None),
            (json!({ "n": null }), None),
            (json!({}), None),
            (json!({ "n": 4 }), Some("n")),
            (json!({ "n": 0 }), Some("n")),
            (json!({ "n": "4" }), Some("n")),
            (json!({ "best_of": 2 }), Some("best_of")),
            (json!({ "best_of": 1 }), None),
        ];
        for (body, field) in cases {
            assert_eq!(refused_field(body.clone(), false).as_deref(), field, "{body}");
        }
    }

    #[test]
    fn engine_fields_that_would_act_for_hangar_are_refused() {
        assert_eq!(refused_field(json!({ "id_slot": 0 }), true).as_deref(), Some("id_slot"));
        assert_eq!(refused_field(json!({ "id_slot": null }), true), None);
        let template = json!({ "chat_template": "{{ 7 * 7 }}" });
        assert_eq!(refused_field(template, true).as_deref(), Some("chat_template"));
        // The engine's other fields pass unread.
        assert_eq!(refused_field(json!({ "cache_prompt": true, "top_k": 5 }), false), None);
    }

    #[test]
    fn media_by_url_only_where_the_model_allows_it() {
        let image = |url: &str| {
            user(json!([
                { "type": "text", "text": "what is this?" },
                { "type": "image_url", "image_url": { "url": url } }
            ]))
        };
        let cases = [
            (
                image("https://169.254.169.254/latest/meta-data"),
                Some("messages[0].content[1].image_url.url"),
            ),
            (image("http://localhost:8080/admin"), Some("messages[0].content[1].image_url.url")),
            (image("file:///etc/passwd"), Some("messages[0].content[1].image_url.url")),
            (image("data:image/png;base64,iVBORw0KGgo="), None),
            (image("  DATA:image/png;base64,AA=="), None),
            // vLLM's other media, and the string form of the Responses API.
            (
                user(json!([{ "type": "video_url", "video_url": { "url": "https://x/v.mp4" } }])),
                Some("messages[0].content[0].video_url.url"),
            ),
            (
                user(json!([{ "type": "audio_url", "audio_url": { "url": "https://x/a.wav" } }])),
                Some("messages[0].content[0].audio_url.url"),
            ),
            (
                json!({ "input": [{ "role": "user", "content": [{ "type": "input_image", "image_url": "https://x/i.png" }] }] }),
                Some("input[0].content[0].image_url"),
            ),
            (
                json!({ "input": [{ "role": "user", "content": [{ "type": "input_file", "file_url": "https://x/f.pdf" }] }] }),
                Some("input[0].content[0].file_url"),
            ),
            // A URL in text, or a citation's url, is not fetched.
            (user(json!("see https://example.com")), None),
            (
                json!({ "input": [{ "type": "message", "content": [{ "type": "output_text", "text": "t", "annotations": [{ "type": "url_citation", "url": "https://x" }] }] }] }),
                None,
            ),
        ];
        for (body, field) in cases {
            assert_eq!(refused_field(body.clone(), false).as_deref(), field, "{body}");
            assert_eq!(refused_field(body.clone(), true), None, "allowed: {body}");
        }
        // An escaped key is the same key.
        let escaped = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image\u005furl":{"url":"https://x"}}]}]}"#;
        let error = check(escaped.as_bytes(), false).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("messages[0].content[0].image_url.url"));
    }

    #[test]
    fn a_body_with_a_rule_field_twice_is_refused_not_guessed_at() {
        let twice = br#"{"n": 1, "n": 8, "messages": []}"#;
        assert_eq!(check(twice, false).unwrap_err().field.as_deref(), Some("body"));
    }
}
