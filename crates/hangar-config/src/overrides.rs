//! Load override validation: the runtime-only patch a load request may carry.
//!
//! Validation runs in the order the spec's "Validation behavior" describes: first the body's
//! shape against the union of every backend's override fields (a failure there is an HTTP
//! 422, [`OverrideError::Schema`]), then the values against the model's backend and its
//! [`load_constraints`] (a failure there is a 400 `invalid_load_request`,
//! [`OverrideError::Invalid`]), and last the effective model — config with the patch merged
//! over it — must pass config validation again.

use crate::{
    LoadConstraint, LoadField, LoadValueType, ModelConfig, load_constraints, load_field, merge,
    parse_cache_quant,
};
use serde::Serialize;
use serde_json::{Map, Number, Value};

/// A validated runtime-only override patch. Key presence matters: a key present with `null`
/// overrides the configured value with `null` (the engine default).
///
/// ExLlamaV3 cache bits are normalized: a validated patch never holds
/// `exllama_cache_k_bits` / `exllama_cache_v_bits`; they become `exllama_cache_quant`
/// (`"<k>,<v>"`, or `null` when both were `null`), the one field the admin API reports.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct LoadOverride(Map<String, Value>);

impl LoadOverride {
    /// Adds fields that are not load-override fields of the admin API but that a caller has
    /// validated itself (the Lemonade load's `llamacpp_args` and `llamacpp_backend` become
    /// `llama_server_extra_args` / `llama_server_binary_path`). [`LoadOverride::apply`] still
    /// re-checks the effective definition against every config rule.
    pub fn extend_engine_fields(&mut self, fields: Map<String, Value>) {
        self.0.extend(fields);
    }

    /// Whether the patch overrides nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The overridden fields and their values (`null` included).
    pub fn fields(&self) -> &Map<String, Value> {
        &self.0
    }

    /// The effective model: `model.raw()` with this patch merged over it
    /// ([`crate::merge`]; `null` sets `null`), re-parsed and re-checked by
    /// [`ModelConfig::parse`].
    ///
    /// An `exllama_cache_quant` in the patch also clears configured
    /// `exllama_cache_k_bits` / `exllama_cache_v_bits`: they are two spellings of one
    /// setting, and the patch's wins.
    ///
    /// # Errors
    /// [`OverrideError::Invalid`] with config validation's messages when the effective model
    /// does not pass it.
    pub fn apply(&self, model: &ModelConfig) -> Result<ModelConfig, OverrideError> {
        if self.is_empty() {
            return Ok(model.clone());
        }
        let mut raw = model.raw().clone();
        if self.0.contains_key(CACHE_QUANT) {
            for bits in [K_BITS, V_BITS] {
                if let Some(slot) = raw.get_mut(bits) {
                    *slot = Value::Null;
                }
            }
        }
        let mut raw = Value::Object(raw);
        merge(&mut raw, Value::Object(self.0.clone()));
        ModelConfig::parse(&model.name, &raw).map_err(|errors| {
            let field = errors.iter().find_map(|e| {
                self.0.keys().find(|key| e.path.ends_with(&format!(".{key}"))).cloned()
            });
            let message = errors
                .iter()
                .map(|e| match &field {
                    Some(f) if e.path.ends_with(&format!(".{f}")) => e.message.clone(),
                    _ => e.to_string(),
                })
                .collect::<Vec<_>>()
                .join("; ");
            OverrideError::Invalid { field, message }
        })
    }
}

/// Why a load override was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// The body fails the schema (HTTP 422): wrong JSON type, a non-positive value for a
    /// positive integer field, or a field that is no load override of any backend.
    #[error("{field}: {message}")]
    Schema {
        /// The offending field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// Structurally valid but wrong for this backend or these values (HTTP 400
    /// `invalid_load_request`).
    #[error("{}", with_field(.field.as_deref(), .message))]
    Invalid {
        /// The offending field, when one field is to blame.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
}

impl OverrideError {
    /// The offending field, when one field is to blame.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Schema { field, .. } => Some(field),
            Self::Invalid { field, .. } => field.as_deref(),
        }
    }

    /// What is wrong, without the field name.
    pub fn message(&self) -> &str {
        match self {
            Self::Schema { message, .. } | Self::Invalid { message, .. } => message,
        }
    }

    /// Whether this is a schema failure (HTTP 422) rather than an invalid value (400).
    pub fn is_schema(&self) -> bool {
        matches!(self, Self::Schema { .. })
    }

    fn schema(field: &str, message: impl Into<String>) -> Self {
        Self::Schema { field: field.to_owned(), message: message.into() }
    }

    fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid { field: Some(field.to_owned()), message: message.into() }
    }
}

fn with_field(field: Option<&str>, message: &str) -> String {
    match field {
        Some(field) => format!("{field}: {message}"),
        None => message.to_owned(),
    }
}

const CACHE_QUANT: &str = "exllama_cache_quant";
const K_BITS: &str = "exllama_cache_k_bits";
const V_BITS: &str = "exllama_cache_v_bits";

/// Validates `patch` (a load body without `replicas`, which the caller removes and handles)
/// for `model`'s backend, and returns it ready to [`LoadOverride::apply`].
///
/// # Errors
/// [`OverrideError::Schema`] when a value has the wrong JSON type, a positive integer field
/// is `<= 0`, or a key is no load override of any backend; [`OverrideError::Invalid`] when a
/// field belongs to another backend, a value breaks its [`load_constraints`] or the spec's
/// cross-field rules, a `replicas` key is still present, or the effective model fails
/// config validation.
pub fn validate_load_override(
    model: &ModelConfig,
    patch: &Map<String, Value>,
) -> Result<LoadOverride, OverrideError> {
    // 1. The schema: the union of every backend's override fields.
    for (key, value) in patch {
        if key == "replicas" {
            continue;
        }
        let Some(field) = load_field(key) else {
            return Err(OverrideError::schema(key, "unknown field; not a load override field"));
        };
        check_type(field, value)?;
    }

    // 2. The model's backend and the field constraints.
    let constraints = load_constraints(model.backend);
    for (key, value) in patch {
        if key == "replicas" {
            return Err(OverrideError::invalid(
                key,
                "replicas is not a load override; the caller must take it out of the patch",
            ));
        }
        let Some(constraint) = constraints.get(key) else {
            let owners = load_field(key).map_or(&[][..], |f| f.backends);
            let owners: Vec<_> = owners.iter().map(|k| k.as_str()).collect();
            let noun = if owners.len() == 1 { "backend" } else { "backends" };
            let what = if constraints.is_empty() {
                format!("backend {} accepts no load overrides", model.backend)
            } else {
                format!("this model's backend is {}", model.backend)
            };
            return Err(OverrideError::invalid(
                key,
                format!("is a load override of {noun} {}, but {what}", owners.join(", ")),
            ));
        };
        if value.is_null() {
            continue;
        }
        if key == "gpus" {
            check_gpus(model, key, constraint, value)?;
        } else {
            check_value(key, constraint, value)?;
        }
    }

    // 3. Cross-field rules, and the k/v bits normalized into `exllama_cache_quant`.
    let normalized = normalize_cache_bits(patch)?;

    // 4. The effective model must still be a valid config.
    let load_override = LoadOverride(normalized);
    load_override.apply(model)?;
    Ok(load_override)
}

/// The JSON type check of step 1. `null` fits every field.
fn check_type(field: &LoadField, value: &Value) -> Result<(), OverrideError> {
    let name = field.name;
    match (field.value_type, value) {
        (_, Value::Null) => Ok(()),
        (LoadValueType::PositiveInt { .. }, Value::Number(n)) => {
            if n.as_u64().is_some_and(|v| v > 0) {
                Ok(())
            } else if n.is_i64() || n.is_u64() {
                Err(OverrideError::schema(name, format!("must be a positive integer, got {n}")))
            } else {
                Err(OverrideError::schema(name, format!("expected an integer, got {n}")))
            }
        }
        (LoadValueType::PositiveInt { .. }, other) => Err(OverrideError::schema(
            name,
            format!("expected an integer or null, got {}", crate::json_kind(other)),
        )),
        (LoadValueType::Float, Value::Number(_)) | (LoadValueType::Str, Value::String(_)) => Ok(()),
        (LoadValueType::Float, other) => Err(OverrideError::schema(
            name,
            format!("expected a number or null, got {}", crate::json_kind(other)),
        )),
        (LoadValueType::Str, other) => Err(OverrideError::schema(
            name,
            format!("expected a string or null, got {}", crate::json_kind(other)),
        )),
        (LoadValueType::IndexList, Value::Array(items)) => {
            match items.iter().find(|v| v.as_u64().is_none()) {
                None => Ok(()),
                Some(bad) => Err(OverrideError::schema(
                    name,
                    format!("expected GPU indices (non-negative integers), got {bad}"),
                )),
            }
        }
        (LoadValueType::IndexList, other) => Err(OverrideError::schema(
            name,
            format!("expected a list of GPU indices or null, got {}", crate::json_kind(other)),
        )),
    }
}

/// A `gpus` override: a non-empty list of distinct indices in the constraint's range, and
/// when the definition lists GPUs, only some of them (a load narrows where the model may go,
/// never widens it).
fn check_gpus(
    model: &ModelConfig,
    key: &str,
    c: &LoadConstraint,
    value: &Value,
) -> Result<(), OverrideError> {
    let gpus: Vec<u64> = value.as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    if gpus.is_empty() {
        return Err(OverrideError::invalid(key, "must list at least one GPU (null: any allowed)"));
    }
    let max = c.maximum.as_ref().and_then(Number::as_u64).unwrap_or(u64::MAX);
    for (i, &gpu) in gpus.iter().enumerate() {
        if gpu > max {
            return Err(OverrideError::invalid(key, format!("GPU {gpu} is above {max}")));
        }
        if gpus[..i].contains(&gpu) {
            return Err(OverrideError::invalid(key, format!("GPU {gpu} is listed twice")));
        }
    }
    let allowed = &model.gpus;
    if let Some(gpu) = gpus.iter().find(|&&g| !allowed.is_empty() && !allowed.contains(&(g as u32)))
    {
        return Err(OverrideError::invalid(
            key,
            format!(
                "GPU {gpu} is not one the definition allows ({allowed:?}); a load may only narrow them"
            ),
        ));
    }
    Ok(())
}

/// The value checks of step 2, for a non-null value whose JSON type already passed.
fn check_value(key: &str, c: &LoadConstraint, value: &Value) -> Result<(), OverrideError> {
    let field = load_field(key).map_or(LoadValueType::Str, |f| f.value_type);
    match field {
        LoadValueType::PositiveInt { max: type_max } => {
            let v = value.as_u64().unwrap_or_default();
            if let Some(min) = c.minimum.as_ref().and_then(|n| n.as_u64())
                && v < min
            {
                return Err(OverrideError::invalid(key, format!("must be >= {min}, got {v}")));
            }
            let max = c.maximum.as_ref().and_then(|n| n.as_u64()).unwrap_or(type_max);
            if v > max {
                return Err(OverrideError::invalid(key, format!("must be <= {max}, got {v}")));
            }
            // The spec enforces the step only for the ExLlamaV3 cache size; elsewhere it is a
            // UI hint.
            if key == "exllama_cache_size"
                && let Some(step) = c.step.as_ref().and_then(|n| n.as_u64())
                && step > 0
                && !v.is_multiple_of(step)
            {
                return Err(OverrideError::invalid(
                    key,
                    format!("must be a multiple of {step}, got {v}"),
                ));
            }
            Ok(())
        }
        LoadValueType::Float => {
            let v = value.as_f64().unwrap_or_default();
            let min = c.minimum.as_ref().and_then(|n| n.as_f64()).unwrap_or(f64::NEG_INFINITY);
            let max = c.maximum.as_ref().and_then(|n| n.as_f64()).unwrap_or(f64::INFINITY);
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(OverrideError::invalid(
                    key,
                    format!("must be between {min} and {max}, got {v}"),
                ))
            }
        }
        LoadValueType::Str => {
            let s = value.as_str().unwrap_or_default();
            match key {
                CACHE_QUANT => {
                    parse_cache_quant(s).map(drop).map_err(|m| OverrideError::invalid(key, m))
                }
                // The UI offers the enum's values; the service accepts any dtype vLLM does.
                "vllm_kv_cache_dtype" => {
                    if s.trim().is_empty() {
                        Err(OverrideError::invalid(key, "must not be empty"))
                    } else {
                        Ok(())
                    }
                }
                _ if !c.allowed_values.is_empty() && !c.allows(value) => {
                    let allowed: Vec<String> =
                        c.allowed_values.iter().map(Value::to_string).collect();
                    Err(OverrideError::invalid(
                        key,
                        format!("must be one of {}, got {value}", allowed.join(", ")),
                    ))
                }
                _ => Ok(()),
            }
        }
        // Checked with the model in `check_gpus`.
        LoadValueType::IndexList => Ok(()),
    }
}

/// Checks the ExLlamaV3 cache-bits rules and rewrites `exllama_cache_k_bits` /
/// `exllama_cache_v_bits` as `exllama_cache_quant` in the key's place.
fn normalize_cache_bits(patch: &Map<String, Value>) -> Result<Map<String, Value>, OverrideError> {
    let (k, v) = (patch.get(K_BITS), patch.get(V_BITS));
    let quant = match (k, v) {
        (None, None) => return Ok(patch.clone()),
        (Some(_), None) => {
            return Err(OverrideError::invalid(
                K_BITS,
                "must be sent together with exllama_cache_v_bits",
            ));
        }
        (None, Some(_)) => {
            return Err(OverrideError::invalid(
                V_BITS,
                "must be sent together with exllama_cache_k_bits",
            ));
        }
        _ if patch.contains_key(CACHE_QUANT) => {
            return Err(OverrideError::invalid(
                CACHE_QUANT,
                "cannot be combined with exllama_cache_k_bits / exllama_cache_v_bits in the same load request",
            ));
        }
        (Some(Value::Null), Some(Value::Null)) => Value::Null,
        (Some(k), Some(v)) => match (k.as_u64(), v.as_u64()) {
            (Some(k), Some(v)) => Value::String(format!("{k},{v}")),
            _ => {
                return Err(OverrideError::Invalid {
                    field: None,
                    message: "exllama_cache_k_bits and exllama_cache_v_bits must both be integers or both be null".into(),
                });
            }
        },
    };
    let mut out = Map::new();
    for (key, value) in patch {
        match key.as_str() {
            K_BITS => {
                out.insert(CACHE_QUANT.to_owned(), quant.clone());
            }
            V_BITS => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(out)
}
