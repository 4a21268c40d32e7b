//! The weights checker's request and answer.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the weights checker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WeightsAction {
    /// Digest every tensor of the weights the model runs on.
    Checksum,
    /// Digest and remember the result for `compare`.
    Snapshot,
    /// Digest and report which tensors differ from the snapshot.
    Compare,
    /// Refused: Hangar never changes weights in place.
    ResetTensors,
}

/// The weights checker's answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct WeightsReport {
    /// The action that ran.
    pub action: WeightsAction,
    /// The digests of the weights as they are on disk now.
    pub digest: WeightsDigest,
    /// For `compare`: the differences from the snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// How long reading and hashing took, milliseconds.
    pub elapsed_ms: u64,
}

/// The container format of digested weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WeightsFormat {
    /// GGUF (llama.cpp), versions 2 and 3.
    Gguf,
    /// Hugging Face safetensors, one file or a directory of shards.
    Safetensors,
}

/// The digest of one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TensorDigest {
    /// The tensor name.
    pub name: String,
    /// The element type, as the file names it (see the [crate docs](crate)).
    pub dtype: String,
    /// The dimensions, in the file's order (see the [crate docs](crate)).
    pub shape: Vec<u64>,
    /// The size of the tensor's data in bytes.
    pub bytes: u64,
    /// SHA-256 of the tensor's name, dtype, shape and data in the encoding the
    /// [crate docs](crate) give, as lowercase hex.
    pub sha256: String,
}

/// The digest of a model's weights: one [`TensorDigest`] per tensor and a checksum over them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WeightsDigest {
    /// The container format.
    pub format: WeightsFormat,
    /// The files read, in the order they were read (file-name order for a directory).
    pub files: Vec<PathBuf>,
    /// Every tensor of every file, sorted by name.
    pub tensors: Vec<TensorDigest>,
    /// SHA-256 over the sorted tensor digests in the encoding the [crate docs](crate) give,
    /// as lowercase hex.
    pub checksum: String,
    /// The tensor data hashed, in bytes (the sum of [`TensorDigest::bytes`]).
    pub bytes: u64,
}

/// What differs between two [`WeightsDigest`]s, by tensor name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Comparison {
    /// Whether no tensor changed, went missing or was added.
    pub identical: bool,
    /// Tensors in both whose digests differ (data, dtype or shape changed), sorted.
    pub changed: Vec<String>,
    /// Tensors in the snapshot but not in the current weights, sorted.
    pub missing: Vec<String>,
    /// Tensors in the current weights but not in the snapshot, sorted.
    pub added: Vec<String>,
    /// How many tensors are in both (and so were compared).
    pub compared: usize,
}

impl From<hangar_runtime::WeightsAction> for WeightsAction {
    fn from(v: hangar_runtime::WeightsAction) -> Self {
        match v {
            hangar_runtime::WeightsAction::Checksum => Self::Checksum,
            hangar_runtime::WeightsAction::Snapshot => Self::Snapshot,
            hangar_runtime::WeightsAction::Compare => Self::Compare,
            hangar_runtime::WeightsAction::ResetTensors => Self::ResetTensors,
        }
    }
}

impl From<WeightsAction> for hangar_runtime::WeightsAction {
    fn from(v: WeightsAction) -> Self {
        match v {
            WeightsAction::Checksum => Self::Checksum,
            WeightsAction::Snapshot => Self::Snapshot,
            WeightsAction::Compare => Self::Compare,
            WeightsAction::ResetTensors => Self::ResetTensors,
        }
    }
}

impl From<hangar_runtime::WeightsReport> for WeightsReport {
    fn from(v: hangar_runtime::WeightsReport) -> Self {
        Self {
            action: v.action.into(),
            digest: v.digest.into(),
            comparison: v.comparison.map(|x| x.into()),
            elapsed_ms: v.elapsed_ms,
        }
    }
}

impl From<hangar_runtime::digest::WeightsFormat> for WeightsFormat {
    fn from(v: hangar_runtime::digest::WeightsFormat) -> Self {
        match v {
            hangar_runtime::digest::WeightsFormat::Gguf => Self::Gguf,
            hangar_runtime::digest::WeightsFormat::Safetensors => Self::Safetensors,
        }
    }
}

impl From<hangar_runtime::digest::TensorDigest> for TensorDigest {
    fn from(v: hangar_runtime::digest::TensorDigest) -> Self {
        Self { name: v.name, dtype: v.dtype, shape: v.shape, bytes: v.bytes, sha256: v.sha256 }
    }
}

impl From<hangar_runtime::digest::WeightsDigest> for WeightsDigest {
    fn from(v: hangar_runtime::digest::WeightsDigest) -> Self {
        Self {
            format: v.format.into(),
            files: v.files,
            tensors: v.tensors.into_iter().map(|x| x.into()).collect(),
            checksum: v.checksum,
            bytes: v.bytes,
        }
    }
}

impl From<hangar_runtime::digest::Comparison> for Comparison {
    fn from(v: hangar_runtime::digest::Comparison) -> Self {
        Self {
            identical: v.identical,
            changed: v.changed,
            missing: v.missing,
            added: v.added,
            compared: v.compared,
        }
    }
}
