//! GGUF headers: where each tensor's bytes lie in a GGUF file (versions 2 and 3).
//!
//! The layout, all little-endian: the magic `GGUF`, a `u32` version, a `u64` tensor count,
//! a `u64` key/value count; the key/value pairs (a string key, a `u32` value type, the
//! value); the tensor infos (a string name, a `u32` dimension count, that many `u64`
//! dimensions, a `u32` ggml type, a `u64` offset into the data section). The data section
//! starts at the end of the header rounded up to `general.alignment` (a `u32`, default 32).
//! Strings are a `u64` length and that many bytes.
//!
//! Every count and length is checked against the bytes left in the file before anything is
//! read or allocated, so a corrupt header is a [`WeightsError::Format`], never a huge
//! allocation or a panic.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use crate::{TensorEntry, WeightsError};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// llama.cpp's `GGML_MAX_DIMS`; its loader refuses tensors with more dimensions.
const MAX_DIMS: u32 = 4;
/// The fewest bytes a key/value pair takes: key length, value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes a tensor info takes: name length, dimension count, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// GGUF metadata value types.
pub(crate) mod value_type {
    pub(crate) const UINT8: u32 = 0;
    pub(crate) const INT8: u32 = 1;
    pub(crate) const UINT16: u32 = 2;
    pub(crate) const INT16: u32 = 3;
    pub(crate) const UINT32: u32 = 4;
    pub(crate) const INT32: u32 = 5;
    pub(crate) const FLOAT32: u32 = 6;
    pub(crate) const BOOL: u32 = 7;
    pub(crate) const STRING: u32 = 8;
    pub(crate) const ARRAY: u32 = 9;
    pub(crate) const UINT64: u32 = 10;
    pub(crate) const INT64: u32 = 11;
    pub(crate) const FLOAT64: u32 = 12;
}

/// A ggml tensor type: its id in GGUF, its name as gguf-py's `GGMLQuantizationType` spells
/// it, and how many elements a block holds in how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GgmlType {
    id: u32,
    name: &'static str,
    /// Elements per block.
    pub(crate) block: u64,
    /// Bytes per block.
    pub(crate) size: u64,
}

const fn ty(id: u32, name: &'static str, block: u64, size: u64) -> GgmlType {
    GgmlType { id, name, block, size }
}

/// ggml's `type_traits` (block size, block bytes), checked against `ggml/include/ggml.h`,
/// `ggml/src/ggml-common.h` (the `sizeof` of every block struct) and gguf-py's
/// `GGML_QUANT_SIZES` in the llama.cpp of llama-cpp-sys-2 0.1.161. Ids 4, 5 and 31..=33,
/// 36..=38 were removed from ggml and are refused.
const GGML_TYPES: &[GgmlType] = &[
    ty(0, "F32", 1, 4),
    ty(1, "F16", 1, 2),
    ty(2, "Q4_0", 32, 18),
    ty(3, "Q4_1", 32, 20),
    ty(6, "Q5_0", 32, 22),
    ty(7, "Q5_1", 32, 24),
    ty(8, "Q8_0", 32, 34),
    ty(9, "Q8_1", 32, 36),
    ty(10, "Q2_K", 256, 84),
    ty(11, "Q3_K", 256, 110),
    ty(12, "Q4_K", 256, 144),
    ty(13, "Q5_K", 256, 176),
    ty(14, "Q6_K", 256, 210),
    ty(15, "Q8_K", 256, 292),
    ty(16, "IQ2_XXS", 256, 66),
    ty(17, "IQ2_XS", 256, 74),
    ty(18, "IQ3_XXS", 256, 98),
    ty(19, "IQ1_S", 256, 50),
    ty(20, "IQ4_NL", 32, 18),
    ty(21, "IQ3_S", 256, 110),
    ty(22, "IQ2_S", 256, 82),
    ty(23, "IQ4_XS", 256, 136),
    ty(24, "I8", 1, 1),
    ty(25, "I16", 1, 2),
    ty(26, "I32", 1, 4),
    ty(27, "I64", 1, 8),
    ty(28, "F64", 1, 8),
    ty(29, "IQ1_M", 256, 56),
    ty(30, "BF16", 1, 2),
    ty(34, "TQ1_0", 256, 54),
    ty(35, "TQ2_0", 256, 66),
    ty(39, "MXFP4", 32, 17),
    ty(40, "NVFP4", 64, 36),
    ty(41, "Q1_0", 128, 18),
    ty(42, "Q2_0", 64, 18),
];

fn ggml_type(id: u32) -> Option<GgmlType> {
    GGML_TYPES.iter().copied().find(|t| t.id == id)
}

/// The ggml type gguf-py names `name` (`F16`, `Q8_0`: exactly, upper case).
pub(crate) fn ggml_type_named(name: &str) -> Option<GgmlType> {
    GGML_TYPES.iter().copied().find(|t| t.name == name)
}

/// The bytes of a tensor of type `ty` and dimensions `dims` (`ne0` first, as stored).
fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, String> {
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % ty.block != 0 {
        return Err(format!(
            "its first dimension {ne0} is not a multiple of the {} block size {}",
            ty.name, ty.block
        ));
    }
    let rows = dims.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d));
    rows.and_then(|rows| (ne0 / ty.block).checked_mul(ty.size)?.checked_mul(rows))
        .ok_or_else(|| format!("its size overflows (dimensions {dims:?}, type {})", ty.name))
}

/// The tensors of the GGUF file at `path`, in header order.
///
/// # Errors
///
/// [`WeightsError::Io`] when the file cannot be read, [`WeightsError::Format`] when it is
/// not a well-formed GGUF v2/v3 file or a tensor lies outside it.
pub(crate) fn read_tensors(path: &Path) -> Result<Vec<TensorEntry>, WeightsError> {
    let (mut r, counts) = open(path)?;
    let (tensor_count, len) = (counts.tensors, r.len);

    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..counts.kvs {
        let (key, value_type) = read_key(&mut r)?;
        if key == b"general.alignment" {
            if value_type != value_type::UINT32 {
                return Err(r.error(format!(
                    "general.alignment has value type {value_type}, expected {} (uint32)",
                    value_type::UINT32
                )));
            }
            let value = r.u32("general.alignment")?;
            if !value.is_power_of_two() {
                return Err(r.error(format!("general.alignment {value} is not a power of two")));
            }
            alignment = u64::from(value);
        } else {
            skip_value(&mut r, value_type)?;
        }
    }

    let mut infos = Vec::with_capacity(usize::try_from(tensor_count).unwrap_or(0).min(4096));
    for _ in 0..tensor_count {
        infos.push(read_tensor_info(&mut r)?);
    }

    let data_start = r.pos.div_ceil(alignment) * alignment;
    infos
        .into_iter()
        .map(|info| {
            if info.offset % alignment != 0 {
                return Err(r.error(format!(
                    "tensor {:?} has offset {}, not a multiple of the alignment {alignment}",
                    info.name, info.offset
                )));
            }
            let start = data_start.checked_add(info.offset);
            let end = start.and_then(|s| s.checked_add(info.bytes)).filter(|&end| end <= len);
            let (Some(start), Some(end)) = (start, end) else {
                return Err(r.error(format!(
                    "tensor {:?} ({} bytes at data offset {}) lies beyond the end of the \
                     {len}-byte file (data section at {data_start})",
                    info.name, info.bytes, info.offset
                )));
            };
            Ok(TensorEntry {
                name: info.name,
                dtype: info.ty.name.to_owned(),
                shape: info.dims,
                range: start..end,
            })
        })
        .collect()
}

/// The counts a GGUF header states, checked against the file's size.
pub(crate) struct Counts {
    pub(crate) tensors: u64,
    pub(crate) kvs: u64,
}

/// Opens the GGUF file at `path` and reads its header up to the first key/value pair:
/// the magic, a supported version, and counts that can fit in the file.
///
/// # Errors
///
/// [`WeightsError::Io`] when the file cannot be read, [`WeightsError::Format`] when it is
/// not GGUF v2/v3 or states more pairs or tensors than it can hold.
pub(crate) fn open(path: &Path) -> Result<(Reader<'_>, Counts), WeightsError> {
    let file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
    let len = file.metadata().map_err(|e| WeightsError::io(path, e))?.len();
    let mut r = Reader { inner: BufReader::new(file), pos: 0, len, path };

    let magic: [u8; 4] = r.array("the magic")?;
    if &magic != MAGIC {
        return Err(r.error(format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")")));
    }
    let version = r.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(r.error(format!("unsupported GGUF version {version} (2 and 3 are supported)")));
    }
    let tensors = r.u64("the tensor count")?;
    let kvs = r.u64("the key/value count")?;
    if kvs > r.remaining() / MIN_KV_BYTES {
        return Err(r.error(format!("{kvs} key/value pairs cannot fit in a {len}-byte file")));
    }
    if tensors > r.remaining() / MIN_TENSOR_INFO_BYTES {
        return Err(r.error(format!("{tensors} tensors cannot fit in a {len}-byte file")));
    }
    Ok((r, Counts { tensors, kvs }))
}

/// A metadata pair's key (never empty) and value type; the value follows.
pub(crate) fn read_key(r: &mut Reader<'_>) -> Result<(Vec<u8>, u32), WeightsError> {
    let key = r.bytes("a metadata key")?;
    if key.is_empty() {
        return Err(r.error(format!("an empty metadata key ends at offset {}", r.pos)));
    }
    let value_type = r.u32("a metadata value type")?;
    Ok((key, value_type))
}

/// A tensor info as the header states it.
struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    bytes: u64,
}

fn read_tensor_info(r: &mut Reader<'_>) -> Result<TensorInfo, WeightsError> {
    let name = String::from_utf8(r.bytes("a tensor name")?)
        .map_err(|_| r.error(format!("a tensor name ending at offset {} is not UTF-8", r.pos)))?;
    if name.is_empty() {
        return Err(r.error(format!("an empty tensor name ends at offset {}", r.pos)));
    }
    let n_dims = r.u32("a tensor's dimension count")?;
    if n_dims > MAX_DIMS {
        return Err(r.error(format!(
            "tensor {name:?} has {n_dims} dimensions (at most {MAX_DIMS} are allowed)"
        )));
    }
    let dims = (0..n_dims).map(|_| r.u64("a tensor dimension")).collect::<Result<Vec<_>, _>>()?;
    let type_id = r.u32("a tensor type")?;
    let ty = ggml_type(type_id)
        .ok_or_else(|| r.error(format!("tensor {name:?} has unknown ggml type {type_id}")))?;
    let offset = r.u64("a tensor offset")?;
    let bytes = tensor_bytes(ty, &dims).map_err(|m| r.error(format!("tensor {name:?}: {m}")))?;
    Ok(TensorInfo { name, dims, ty, offset, bytes })
}

/// The size of a fixed-size metadata value type.
fn scalar_size(value_type: u32) -> Option<u64> {
    use value_type::*;
    match value_type {
        UINT8 | INT8 | BOOL => Some(1),
        UINT16 | INT16 => Some(2),
        UINT32 | INT32 | FLOAT32 => Some(4),
        UINT64 | INT64 | FLOAT64 => Some(8),
        _ => None,
    }
}

/// Skips one metadata value. Nested arrays are refused, as llama.cpp refuses them.
pub(crate) fn skip_value(r: &mut Reader<'_>, value_type: u32) -> Result<(), WeightsError> {
    if let Some(size) = scalar_size(value_type) {
        return r.skip(size, "a metadata value");
    }
    match value_type {
        value_type::STRING => r.skip_string("a metadata string"),
        value_type::ARRAY => {
            let elem_type = r.u32("a metadata array's element type")?;
            let count = r.u64("a metadata array's length")?;
            if let Some(size) = scalar_size(elem_type) {
                let total = count.saturating_mul(size);
                return r.skip(total, "a metadata array");
            }
            match elem_type {
                value_type::STRING => {
                    if count > r.remaining() / 8 {
                        return Err(r.error(format!(
                            "a metadata array of {count} strings cannot fit in the file"
                        )));
                    }
                    (0..count).try_for_each(|_| r.skip_string("a metadata array string"))
                }
                value_type::ARRAY => Err(r.error("nested metadata arrays are not supported")),
                other => Err(r.error(format!("a metadata array has unknown element type {other}"))),
            }
        }
        other => Err(r.error(format!("unknown metadata value type {other}"))),
    }
}

/// A buffered reader that knows its position and the file's length, so every read is
/// checked against the bytes left before it happens.
pub(crate) struct Reader<'a> {
    inner: BufReader<File>,
    pos: u64,
    len: u64,
    path: &'a Path,
}

impl Reader<'_> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    pub(crate) fn error(&self, message: impl Into<String>) -> WeightsError {
        WeightsError::format(self.path, message)
    }

    /// Fails unless `n` more bytes exist; `what` names what was being read.
    fn need(&self, n: u64, what: &str) -> Result<(), WeightsError> {
        if n > self.remaining() {
            return Err(self.error(format!(
                "truncated header: {what} needs {n} bytes at offset {} but the file is {} bytes",
                self.pos, self.len
            )));
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), WeightsError> {
        self.need(buf.len() as u64, what)?;
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => self.error(format!("the file ended while reading {what}")),
            _ => WeightsError::io(self.path, e),
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WeightsError> {
        let mut buf = [0; N];
        self.read_exact(&mut buf, what)?;
        Ok(buf)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, WeightsError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, WeightsError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed string's bytes; the length is checked against the file first.
    pub(crate) fn bytes(&mut self, what: &str) -> Result<Vec<u8>, WeightsError> {
        let n = self.u64(what)?;
        self.need(n, what)?;
        let mut buf = vec![0; usize::try_from(n).map_err(|_| self.error("string too long"))?];
        self.read_exact(&mut buf, what)?;
        Ok(buf)
    }

    fn skip_string(&mut self, what: &str) -> Result<(), WeightsError> {
        let n = self.u64(what)?;
        self.skip(n, what)
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), WeightsError> {
        self.need(n, what)?;
        // `need` bounds `n` by the file length, which fits an i64.
        let delta = i64::try_from(n).map_err(|_| self.error("offset overflow"))?;
        self.inner.seek_relative(delta).map_err(|e| WeightsError::io(self.path, e))?;
        self.pos += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_type_ids_and_names_are_unique() {
        for (i, a) in GGML_TYPES.iter().enumerate() {
            for b in &GGML_TYPES[i + 1..] {
                assert_ne!(a.id, b.id);
                assert_ne!(a.name, b.name);
            }
        }
    }

    #[test]
    fn removed_ggml_types_are_unknown() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(ggml_type(id), None, "type {id}");
        }
    }

    #[test]
    fn tensor_bytes_follow_blocks_and_rows() {
        let check = |id: u32, dims: &[u64], expected: Result<u64, ()>| {
            let ty = ggml_type(id).unwrap();
            assert_eq!(tensor_bytes(ty, dims).map_err(|_| ()), expected, "{} {dims:?}", ty.name);
        };
        check(0, &[64, 3], Ok(64 * 3 * 4));
        check(0, &[], Ok(4));
        check(30, &[7], Ok(14));
        check(8, &[64, 2, 3], Ok(2 * 34 * 6));
        check(12, &[512, 10], Ok(2 * 144 * 10));
        check(39, &[32], Ok(17));
        check(8, &[16], Err(()));
        check(12, &[128, 1], Err(()));
        check(0, &[0, 5], Ok(0));
        check(0, &[1, u64::MAX, 2], Err(()));
        check(28, &[u64::MAX], Err(()));
    }
}
