//! [`LoadConstraint`]: how one live-load field is shown and checked, as the admin API's
//! `load_constraints` serializes it.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// The kind of UI control a load constraint describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    /// A whole number (`minimum`, optional `maximum`, `step`).
    Integer,
    /// One of `allowed_values`.
    Enum,
    /// A string, or `null` for the runtime default.
    StringOrNull,
    /// A whole number, or `null` (see `null_means`).
    IntegerOrNull,
    /// A real number between `minimum` and `maximum`.
    Float,
    /// A list of GPU indices (NVML's, PCI bus order), each between `minimum` and `maximum`,
    /// or `null` (see `null_means`). Hangar's addition: where a load may go.
    GpuList,
}

/// One live-load field's constraint, as the admin API shows it under `load_constraints`.
///
/// Fields are declared in the order the spec prints them, and absent ones are not
/// serialized. `default` distinguishes "no default" (`None`, key absent) from an explicit
/// `"default": null` (`Some(Value::Null)`).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LoadConstraint {
    /// The control kind.
    pub kind: ConstraintKind,
    /// A named value format (`ggml_type_name`, `<bits>|<k_bits>,<v_bits>`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The smallest accepted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum: Option<Number>,
    /// The largest accepted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximum: Option<Number>,
    /// The increment a UI control should use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<Number>,
    /// The concrete runtime default; `Some(Value::Null)` is an explicit `null` default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// What `null` stands for (`fp16`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub null_means: Option<String>,
    /// The values a UI should offer (and, except where noted, the only ones accepted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_values: Vec<Value>,
    /// Example values, most useful first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Value>,
    /// The unit of the value (`bytes`, `pixels`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The unit a UI should display the value in (`mib`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_unit: Option<String>,
}

impl LoadConstraint {
    /// A constraint of `kind` with nothing else set.
    pub fn new(kind: ConstraintKind) -> Self {
        Self {
            kind,
            format: None,
            minimum: None,
            maximum: None,
            step: None,
            default: None,
            null_means: None,
            allowed_values: Vec::new(),
            examples: Vec::new(),
            unit: None,
            display_unit: None,
        }
    }

    /// An integer constraint with `minimum` and `step`.
    pub(crate) fn integer(minimum: u64, step: u64) -> Self {
        Self {
            minimum: Some(minimum.into()),
            step: Some(step.into()),
            ..Self::new(ConstraintKind::Integer)
        }
    }

    pub(crate) fn format(mut self, format: &str) -> Self {
        self.format = Some(format.to_owned());
        self
    }

    pub(crate) fn range(mut self, minimum: Option<Number>, maximum: Option<Number>) -> Self {
        self.minimum = minimum.or(self.minimum);
        self.maximum = maximum;
        self
    }

    pub(crate) fn default_value(mut self, default: Value) -> Self {
        self.default = Some(default);
        self
    }

    pub(crate) fn allowed(mut self, values: impl IntoIterator<Item = impl Into<Value>>) -> Self {
        self.allowed_values = values.into_iter().map(Into::into).collect();
        self
    }

    pub(crate) fn examples(mut self, values: impl IntoIterator<Item = impl Into<Value>>) -> Self {
        self.examples = values.into_iter().map(Into::into).collect();
        self
    }

    pub(crate) fn unit(mut self, unit: &str, display_unit: Option<&str>) -> Self {
        self.unit = Some(unit.to_owned());
        self.display_unit = display_unit.map(str::to_owned);
        self
    }

    pub(crate) fn null_means(mut self, meaning: &str) -> Self {
        self.null_means = Some(meaning.to_owned());
        self
    }

    /// The minimum as an integer, when there is one and it is integral.
    pub fn minimum_i64(&self) -> Option<i64> {
        self.minimum.as_ref().and_then(Number::as_i64)
    }

    /// The maximum as an integer, when there is one and it is integral.
    pub fn maximum_i64(&self) -> Option<i64> {
        self.maximum.as_ref().and_then(Number::as_i64)
    }

    /// Whether `value` is one of `allowed_values`.
    pub fn allows(&self, value: &Value) -> bool {
        self.allowed_values.contains(value)
    }
}

/// The live-load fields of one backend kind and their constraints, in the spec's order.
///
/// Serializes as a JSON object keyed by field name; `{}` for backends without live-load
/// fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadConstraints(pub(crate) Vec<(&'static str, LoadConstraint)>);

impl LoadConstraints {
    /// The constraint of `field`, if it is a live-load field of this backend.
    pub fn get(&self, field: &str) -> Option<&LoadConstraint> {
        self.0.iter().find(|(name, _)| *name == field).map(|(_, c)| c)
    }

    /// Whether `field` is a live-load field of this backend.
    pub fn contains(&self, field: &str) -> bool {
        self.get(field).is_some()
    }

    /// The field names, in order.
    pub fn fields(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().map(|(name, _)| *name)
    }

    /// Field names with their constraints, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &LoadConstraint)> + '_ {
        self.0.iter().map(|(name, c)| (*name, c))
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the backend has no live-load fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for LoadConstraints {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, constraint) in &self.0 {
            map.serialize_entry(name, constraint)?;
        }
        map.end()
    }
}

impl JsonSchema for LoadConstraints {
    fn schema_name() -> Cow<'static, str> {
        "LoadConstraints".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let constraint = generator.subschema_for::<LoadConstraint>();
        json_schema!({
            "description": "Live-load fields of the model's backend, keyed by field name.",
            "type": "object",
            "additionalProperties": constraint
        })
    }
}
