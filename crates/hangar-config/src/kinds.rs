//! Closed vocabularies: backend kinds, model types, devices, prompt formats and the small
//! enums backend fields use. All serialize in snake_case.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// The engine that runs a model.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum BackendKind {
    /// llama.cpp in-process, through `llama-cpp-2`.
    LlamaCpp,
    /// llama.cpp's `llama-server`, run as a supervised subprocess.
    LlamaServer,
    /// vLLM in a Python worker process (the bridge).
    Vllm,
    /// `vllm serve`, run as a supervised subprocess.
    VllmServe,
    /// ExLlamaV3 in a Python worker process (the bridge).
    #[serde(rename = "exllamav3")]
    #[strum(serialize = "exllamav3")]
    ExLlamaV3,
    /// CTranslate2.
    Ct2,
    /// A remote OpenAI-compatible server; Hangar only forwards.
    OpenaiRemote,
    /// The deterministic test backend: simulated loads, tokens and failures.
    Stub,
}

impl BackendKind {
    /// Every backend kind, in a stable order.
    pub const ALL: [BackendKind; 8] = [
        Self::LlamaCpp,
        Self::LlamaServer,
        Self::Vllm,
        Self::VllmServe,
        Self::ExLlamaV3,
        Self::Ct2,
        Self::OpenaiRemote,
        Self::Stub,
    ];

    /// The snake_case name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The devices a model of this backend occupies when its config names none.
    ///
    /// Remote models occupy no local device; the stub pretends to run on the CPU.
    pub const fn default_device(self) -> Device {
        match self {
            Self::LlamaCpp
            | Self::LlamaServer
            | Self::Vllm
            | Self::VllmServe
            | Self::ExLlamaV3
            | Self::Ct2 => Device::GPU,
            Self::OpenaiRemote => Device::empty(),
            Self::Stub => Device::CPU,
        }
    }
}

/// What a model serves; each type has its own slots in `max_loaded_models`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ModelType {
    /// A chat / completion model.
    Llm,
    /// An embedding model.
    Embedding,
    /// A reranking model.
    Reranking,
}

impl ModelType {
    /// Every model type, in a stable order.
    pub const ALL: [ModelType; 3] = [Self::Llm, Self::Embedding, Self::Reranking];

    /// The type implied by a model's labels: `embedding` wins, then `reranking`, else `llm`.
    pub fn from_labels<S: AsRef<str>>(labels: &[S]) -> Self {
        let has = |wanted: &str| labels.iter().any(|l| l.as_ref() == wanted);
        if has("embedding") {
            Self::Embedding
        } else if has("reranking") {
            Self::Reranking
        } else {
            Self::Llm
        }
    }

    /// The snake_case name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

bitflags::bitflags! {
    /// The devices a model occupies, as flags: `device & Device::NPU` asks whether it uses
    /// the NPU.
    ///
    /// In config a device is a name (`"cpu"`, `"gpu"`, `"npu"`; `"cuda"` is read as `"gpu"`)
    /// or a list of names (`["gpu", "npu"]`). It serializes as a list.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Device: u8 {
        /// The host CPU.
        const CPU = 1;
        /// A GPU.
        const GPU = 1 << 1;
        /// An NPU; only one model may hold it at a time.
        const NPU = 1 << 2;
    }
}

impl Device {
    /// Devices only one loaded model may occupy at a time.
    pub const EXCLUSIVE: Device = Device::NPU;

    const NAMES: [(&'static str, Device); 3] =
        [("cpu", Device::CPU), ("gpu", Device::GPU), ("npu", Device::NPU)];

    /// Parses one device name.
    pub fn parse_name(name: &str) -> Option<Device> {
        match name {
            "cpu" => Some(Device::CPU),
            "gpu" | "cuda" => Some(Device::GPU),
            "npu" => Some(Device::NPU),
            _ => None,
        }
    }

    /// The names of the flags set, in the order cpu, gpu, npu.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMES.into_iter().filter(move |(_, d)| self.contains(*d)).map(|(n, _)| n)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = self.names().collect();
        if names.is_empty() { f.write_str("none") } else { f.write_str(&names.join("|")) }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for name in self.names() {
            seq.serialize_element(name)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DeviceVisitor;
        const EXPECTED: &[&str] = &["cpu", "gpu", "cuda", "npu"];

        impl<'de> Visitor<'de> for DeviceVisitor {
            type Value = Device;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device name (cpu, gpu, npu) or a list of them")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Device, E> {
                Device::parse_name(v).ok_or_else(|| E::unknown_variant(v, EXPECTED))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Device, A::Error> {
                let mut device = Device::empty();
                while let Some(name) = seq.next_element::<Cow<'de, str>>()? {
                    device |= Device::parse_name(&name)
                        .ok_or_else(|| de::Error::unknown_variant(&name, EXPECTED))?;
                }
                Ok(device)
            }
        }

        deserializer.deserialize_any(DeviceVisitor)
    }
}

impl JsonSchema for Device {
    fn schema_name() -> Cow<'static, str> {
        "Device".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Device(s) the model occupies: a name or a list of names. 'cuda' means 'gpu'.",
            "oneOf": [
                { "type": "string", "enum": ["cpu", "gpu", "cuda", "npu"] },
                { "type": "array", "items": { "type": "string", "enum": ["cpu", "gpu", "cuda", "npu"] } }
            ]
        })
    }
}

/// How a model's messages are rendered into a prompt.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PromptFormat {
    /// A plain `role: content` transcript.
    Generic,
    /// Mistral's `[INST]` template.
    MistralTemplate,
    /// Qwen3's ChatML template with thinking control.
    Qwen3Template,
    /// Gemma 4's template with thinking control.
    Gemma4Template,
    /// TranslateGemma's structured single-turn translation request.
    TranslategemmaTemplate,
    /// The chat template embedded in the model file.
    Auto,
}

impl PromptFormat {
    /// The snake_case name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A three-way switch used by engine flags such as flash attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Switch {
    /// Force on.
    On,
    /// Force off.
    Off,
    /// Let the engine decide.
    Auto,
}

/// A GGML tensor type accepted for the llama.cpp KV cache.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[allow(missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Iq4Nl,
    Q5_0,
    Q5_1,
}

impl GgmlType {
    /// Every accepted cache type, in the order the spec lists them.
    pub const ALL: [GgmlType; 9] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Iq4Nl,
        Self::Q5_0,
        Self::Q5_1,
    ];

    /// The ggml type name (`q8_0`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether this is a quantized type (not `f32`, `f16` or `bf16`).
    pub const fn is_quantized(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::Bf16)
    }
}

/// The speculative-decoding mode of `llama-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SpecType {
    /// Multi-token-prediction draft heads.
    #[serde(rename = "draft-mtp")]
    DraftMtp,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_type_from_labels() {
        assert_eq!(ModelType::from_labels::<&str>(&[]), ModelType::Llm);
        assert_eq!(ModelType::from_labels(&["chat", "vision"]), ModelType::Llm);
        assert_eq!(ModelType::from_labels(&["embedding"]), ModelType::Embedding);
        assert_eq!(ModelType::from_labels(&["reranking", "x"]), ModelType::Reranking);
        // Both labels: embedding is checked first, as in the multi-model spec.
        assert_eq!(ModelType::from_labels(&["reranking", "embedding"]), ModelType::Embedding);
        // Labels are matched exactly, not by substring or case.
        assert_eq!(ModelType::from_labels(&["Embedding", "embeddings"]), ModelType::Llm);
    }

    #[test]
    fn backend_default_devices() {
        use BackendKind::*;
        let expected = [
            (LlamaCpp, Device::GPU),
            (LlamaServer, Device::GPU),
            (Vllm, Device::GPU),
            (VllmServe, Device::GPU),
            (ExLlamaV3, Device::GPU),
            (Ct2, Device::GPU),
            (OpenaiRemote, Device::empty()),
            (Stub, Device::CPU),
        ];
        assert_eq!(expected.len(), BackendKind::ALL.len());
        for (kind, device) in expected {
            assert_eq!(kind.default_device(), device, "{kind}");
        }
    }

    #[test]
    fn device_is_a_bitmask_that_parses_names_and_lists() {
        let hybrid: Device = serde_json::from_value(json!(["gpu", "npu"])).unwrap();
        assert!(hybrid.contains(Device::NPU) && hybrid.contains(Device::GPU));
        assert!(hybrid.intersects(Device::EXCLUSIVE));
        assert_eq!(serde_json::to_value(hybrid).unwrap(), json!(["gpu", "npu"]));
        let cuda: Device = serde_json::from_value(json!("cuda")).unwrap();
        assert_eq!(cuda, Device::GPU);
        assert!(!cuda.intersects(Device::EXCLUSIVE));
        let err = serde_json::from_value::<Device>(json!("tpu")).unwrap_err().to_string();
        assert!(err.contains("unknown variant `tpu`"), "{err}");
        assert_eq!(Device::GPU.to_string(), "gpu");
        assert_eq!((Device::GPU | Device::NPU).to_string(), "gpu|npu");
    }

    #[test]
    fn enums_serialize_snake_case() {
        assert_eq!(serde_json::to_value(BackendKind::ExLlamaV3).unwrap(), json!("exllamav3"));
        assert_eq!(serde_json::to_value(BackendKind::VllmServe).unwrap(), json!("vllm_serve"));
        for kind in BackendKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.as_str()));
        }
        for ty in GgmlType::ALL {
            assert_eq!(serde_json::to_value(ty).unwrap(), json!(ty.as_str()));
        }
        for ty in ModelType::ALL {
            assert_eq!(serde_json::to_value(ty).unwrap(), json!(ty.to_string()));
        }
        for format in [PromptFormat::Qwen3Template, PromptFormat::TranslategemmaTemplate] {
            assert_eq!(serde_json::to_value(format).unwrap(), json!(format.as_str()));
        }
        assert_eq!(serde_json::to_value(SpecType::DraftMtp).unwrap(), json!("draft-mtp"));
        assert!(serde_json::from_value::<GgmlType>(json!("q8-0")).is_err());
    }
}
