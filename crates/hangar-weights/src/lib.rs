//! Hangar's weights checker: strict SHA-256 digests of a model's tensors, read from disk.
//!
//! This crate owns reading GGUF and safetensors headers far enough to find every tensor's
//! name, dtype, shape and bytes, hashing each tensor, deriving a model checksum from the
//! sorted tensor digests ([`digest`]), and comparing two such digests ([`compare`]) — a
//! snapshot taken earlier against the weights on disk now. It knows nothing of HTTP, of
//! where snapshots are stored, or of loaded models.
//!
//! It also reads a GGUF model's attention shape from its metadata ([`gguf_shape`]): layers,
//! KV heads per layer, head sizes, trained context; enough to size its KV cache
//! ([`GgufShape::kv_cache_bytes`]) before the model is loaded.
//!
//! I/O is synchronous and blocking (an async caller runs [`digest`] in `spawn_blocking`).
//! Tensor data is read in 1 MiB chunks, so memory stays bounded for multi-gigabyte files;
//! every header count and length is checked against the file size before it is used, so a
//! corrupt file is a [`WeightsError::Format`], never a panic or a huge allocation.
//!
//! # The digests
//!
//! Integers are `u64` little-endian; a string is its byte length as such a `u64`, then its
//! UTF-8 bytes. A tensor's digest ([`TensorDigest::sha256`]) is SHA-256 over
//!
//! ```text
//! len(name) || name || len(dtype) || dtype || n_dims || dim_0 || … || dim_{n-1} || len(data) || data
//! ```
//!
//! and the model [`checksum`](WeightsDigest::checksum) is SHA-256 over, for every tensor in
//! ascending byte order of the names, `len(name) || name || digest` (the 32 raw digest
//! bytes). The checksum depends on the tensors only: not on file names, on how tensors are
//! split into shards, on their order in a file, or on metadata other than tensor data.
//!
//! The dtype is the ggml type name as gguf-py spells it (`F32`, `Q8_0`, `Q4_K`, `BF16`) for
//! GGUF and the header's `dtype` string (`F32`, `BF16`, `F8_E4M3`) for safetensors. The
//! shape is the dimensions as the file stores them: GGUF's `ne0` (the fastest-varying) first,
//! safetensors' outermost first.
//!
//! ```no_run
//! use std::path::Path;
//!
//! let snapshot = hangar_weights::digest(Path::new("models/llama.gguf"))?;
//! // … later …
//! let current = hangar_weights::digest(Path::new("models/llama.gguf"))?;
//! let report = hangar_weights::compare(&snapshot, &current);
//! assert!(report.identical, "changed tensors: {:?}", report.changed);
//! # Ok::<(), hangar_weights::WeightsError>(())
//! ```

mod error;
mod gguf;
mod gguf_shape;
mod hash;
mod safetensors;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use error::WeightsError;
pub use gguf_shape::{GgufShape, gguf_shape};

/// The container format of digested weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsFormat {
    /// GGUF (llama.cpp), versions 2 and 3.
    Gguf,
    /// Hugging Face safetensors, one file or a directory of shards.
    Safetensors,
}

/// The digest of one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Where one tensor's data lies on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLocation {
    /// The file holding the tensor.
    pub file: PathBuf,
    /// The tensor name.
    pub name: String,
    /// The element type, as in [`TensorDigest::dtype`].
    pub dtype: String,
    /// The dimensions, as in [`TensorDigest::shape`].
    pub shape: Vec<u64>,
    /// The byte range of the tensor's data in `file` (absolute offsets).
    pub range: Range<u64>,
}

/// What differs between two [`WeightsDigest`]s, by tensor name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// A parsed tensor, before hashing: what a format module reports for one file.
pub(crate) struct TensorEntry {
    pub(crate) name: String,
    pub(crate) dtype: String,
    pub(crate) shape: Vec<u64>,
    pub(crate) range: Range<u64>,
}

/// Digests the weights at `path`.
///
/// `path` is a GGUF file, a file ending in `.safetensors`, or a directory. A directory
/// digests every `*.safetensors` file in it (a sharded checkpoint), or, if it has none,
/// every `*.gguf` file, in file-name order; subdirectories are not searched, symbolic
/// links are followed. Every header is checked before any tensor data is read.
///
/// # Errors
///
/// [`WeightsError::Io`] when a file cannot be read, [`WeightsError::Format`] when one is
/// malformed, [`WeightsError::Empty`] when there are no tensors, and
/// [`WeightsError::DuplicateTensor`] when two tensors share a name.
pub fn digest(path: &Path) -> Result<WeightsDigest, WeightsError> {
    let (format, files) = resolve(path)?;
    // Grouped by file, each file's tensors by offset: every file is read front to back.
    let located = locate(path, format, &files)?;

    let mut buf = vec![0; hash::CHUNK_BYTES];
    let mut open: Option<(&Path, File)> = None;
    let mut hashed = Vec::with_capacity(located.len());
    for loc in &located {
        let file = match &mut open {
            Some((p, f)) if *p == loc.file.as_path() => f,
            slot => {
                let f = File::open(&loc.file).map_err(|e| WeightsError::io(&loc.file, e))?;
                &mut slot.insert((&loc.file, f)).1
            }
        };
        let header = hash::TensorHeader {
            name: &loc.name,
            dtype: &loc.dtype,
            shape: &loc.shape,
            bytes: loc.range.end - loc.range.start,
        };
        let sha = hash::tensor_from_file(&header, file, &loc.file, loc.range.start, &mut buf)?;
        hashed.push((loc, sha));
    }
    hashed.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));

    let checksum = hash::checksum(hashed.iter().map(|(loc, sha)| (loc.name.as_str(), sha)));
    let tensors: Vec<TensorDigest> = hashed
        .iter()
        .map(|(loc, sha)| TensorDigest {
            name: loc.name.clone(),
            dtype: loc.dtype.clone(),
            shape: loc.shape.clone(),
            bytes: loc.range.end - loc.range.start,
            sha256: hash::hex(sha),
        })
        .collect();
    Ok(WeightsDigest {
        format,
        files,
        bytes: tensors.iter().map(|t| t.bytes).sum(),
        tensors,
        checksum: hash::hex(&checksum),
    })
}

/// Where every tensor of the weights at `path` lies, sorted by name, without hashing.
/// `path` is read as [`digest`] reads it.
///
/// # Errors
///
/// As [`digest`].
pub fn locate_tensors(path: &Path) -> Result<Vec<TensorLocation>, WeightsError> {
    let (format, files) = resolve(path)?;
    let mut located = locate(path, format, &files)?;
    located.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(located)
}

/// Compares a digest taken earlier (`snapshot`) with one of the weights now (`current`),
/// tensor by tensor. A tensor counts as changed when its [`TensorDigest::sha256`] differs,
/// which covers its data, dtype and shape.
pub fn compare(snapshot: &WeightsDigest, current: &WeightsDigest) -> Comparison {
    let by_name = |d: &WeightsDigest| -> BTreeMap<String, String> {
        d.tensors.iter().map(|t| (t.name.clone(), t.sha256.clone())).collect()
    };
    let (before, now) = (by_name(snapshot), by_name(current));
    let mut changed = Vec::new();
    let mut missing = Vec::new();
    let mut compared = 0;
    for (name, sha) in &before {
        match now.get(name) {
            Some(current) => {
                compared += 1;
                if current != sha {
                    changed.push(name.clone());
                }
            }
            None => missing.push(name.clone()),
        }
    }
    let added: Vec<String> = now.keys().filter(|n| !before.contains_key(*n)).cloned().collect();
    Comparison {
        identical: changed.is_empty() && missing.is_empty() && added.is_empty(),
        changed,
        missing,
        added,
        compared,
    }
}

/// The format and the files to read for `path`.
fn resolve(path: &Path) -> Result<(WeightsFormat, Vec<PathBuf>), WeightsError> {
    let meta = std::fs::metadata(path).map_err(|e| WeightsError::io(path, e))?;
    if !meta.is_dir() {
        let format = if has_extension(path, "safetensors") {
            WeightsFormat::Safetensors
        } else {
            WeightsFormat::Gguf
        };
        return Ok((format, vec![path.to_path_buf()]));
    }
    let mut safetensors = BTreeSet::new();
    let mut gguf = BTreeSet::new();
    for entry in std::fs::read_dir(path).map_err(|e| WeightsError::io(path, e))? {
        let file = entry.map_err(|e| WeightsError::io(path, e))?.path();
        let set = if has_extension(&file, "safetensors") {
            &mut safetensors
        } else if has_extension(&file, "gguf") {
            &mut gguf
        } else {
            continue;
        };
        // `metadata` follows symbolic links (Hugging Face cache snapshots are links to blobs).
        if std::fs::metadata(&file).map_err(|e| WeightsError::io(&file, e))?.is_file() {
            set.insert(file);
        }
    }
    if !safetensors.is_empty() {
        Ok((WeightsFormat::Safetensors, safetensors.into_iter().collect()))
    } else if !gguf.is_empty() {
        Ok((WeightsFormat::Gguf, gguf.into_iter().collect()))
    } else {
        Err(WeightsError::Empty { path: path.to_path_buf() })
    }
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension().is_some_and(|e| e == ext)
}

/// Every tensor of `files`, grouped by file in order and by offset within a file; checks
/// that names are unique and that there is at least one tensor.
fn locate(
    path: &Path,
    format: WeightsFormat,
    files: &[PathBuf],
) -> Result<Vec<TensorLocation>, WeightsError> {
    let mut located = Vec::new();
    for file in files {
        let mut entries = match format {
            WeightsFormat::Gguf => gguf::read_tensors(file)?,
            WeightsFormat::Safetensors => safetensors::read_tensors(file)?,
        };
        entries.sort_by_key(|e| e.range.start);
        located.extend(entries.into_iter().map(|e| TensorLocation {
            file: file.clone(),
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            range: e.range,
        }));
    }
    let mut seen: BTreeMap<&str, &Path> = BTreeMap::new();
    for loc in &located {
        if let Some(first) = seen.insert(&loc.name, &loc.file) {
            return Err(WeightsError::DuplicateTensor {
                name: loc.name.clone(),
                first: first.to_path_buf(),
                second: loc.file.clone(),
            });
        }
    }
    if located.is_empty() {
        return Err(WeightsError::Empty { path: path.to_path_buf() });
    }
    Ok(located)
}
