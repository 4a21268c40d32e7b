//! Safetensors headers: where each tensor's bytes lie in a `.safetensors` file.
//!
//! The layout: a `u64` little-endian header length `N`, `N` bytes of JSON
//! `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {…}}`, then the
//! data; offsets are relative to the data, which starts at `8 + N`.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use serde::Deserialize;

use crate::{TensorEntry, WeightsError};

/// The largest header accepted, as the reference implementation's `MAX_HEADER_SIZE`.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor's entry in the JSON header.
#[derive(Deserialize)]
struct TensorInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The tensors of the safetensors file at `path`, in header order.
///
/// # Errors
///
/// [`WeightsError::Io`] when the file cannot be read, [`WeightsError::Format`] when the
/// header is truncated or not the expected JSON, or a tensor's offsets are reversed or lie
/// outside the file.
pub(crate) fn read_tensors(path: &Path) -> Result<Vec<TensorEntry>, WeightsError> {
    let bad = |message: String| WeightsError::format(path, message);
    let mut file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
    let len = file.metadata().map_err(|e| WeightsError::io(path, e))?.len();
    if len < 8 {
        return Err(bad(format!(
            "not a safetensors file: {len} bytes, shorter than the 8-byte header length"
        )));
    }
    let mut prefix = [0; 8];
    read_exact(&mut file, &mut prefix, path)?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > len - 8 {
        return Err(bad(format!(
            "the header length {header_len} runs past the end of the {len}-byte file"
        )));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "the header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes"
        )));
    }
    // Bounded by MAX_HEADER_BYTES just above.
    let mut header = vec![0; header_len as usize];
    read_exact(&mut file, &mut header, path)?;
    let entries: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("the JSON header does not parse as an object: {e}")))?;

    let data_start = 8 + header_len;
    let data_len = len - data_start;
    entries
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, value)| {
            let info: TensorInfo = serde_json::from_value(value)
                .map_err(|e| bad(format!("tensor {name:?}: malformed header entry: {e}")))?;
            let [begin, end] = info.data_offsets;
            if end < begin {
                return Err(bad(format!(
                    "tensor {name:?}: data_offsets [{begin}, {end}] end before they begin"
                )));
            }
            if end > data_len {
                return Err(bad(format!(
                    "tensor {name:?}: data_offsets [{begin}, {end}] run past the end of the \
                     {data_len}-byte data section"
                )));
            }
            Ok(TensorEntry {
                name,
                dtype: info.dtype,
                shape: info.shape,
                range: data_start + begin..data_start + end,
            })
        })
        .collect()
}

fn read_exact(file: &mut File, buf: &mut [u8], path: &Path) -> Result<(), WeightsError> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => WeightsError::format(path, "the file ended inside the header"),
        _ => WeightsError::io(path, e),
    })
}
