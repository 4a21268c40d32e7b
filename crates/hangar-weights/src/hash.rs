//! The digest encoding: what exactly is fed to SHA-256 for a tensor and for the model.
//!
//! Every integer is a `u64`, little-endian; every string is its UTF-8 bytes preceded by its
//! length in bytes as such a `u64`.
//!
//! A tensor's digest is SHA-256 over
//!
//! ```text
//! len(name)  || name
//! len(dtype) || dtype
//! n_dims     || dim_0 || dim_1 || … || dim_{n-1}
//! len(data)  || data
//! ```
//!
//! The model checksum is SHA-256 over, for every tensor in ascending byte order of the names,
//!
//! ```text
//! len(name) || name || the tensor's 32-byte digest (raw, not hex)
//! ```

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;

use ring::digest::{Context, SHA256};

use crate::WeightsError;

/// How much tensor data is read at a time.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;

/// A raw SHA-256 digest.
pub(crate) type Sha256 = [u8; 32];

/// The tensor's description as [`TensorDigest`](crate::TensorDigest) and the hash both see it.
pub(crate) struct TensorHeader<'a> {
    pub(crate) name: &'a str,
    pub(crate) dtype: &'a str,
    pub(crate) shape: &'a [u64],
    pub(crate) bytes: u64,
}

/// Starts a tensor digest: everything before the data, including the data's length.
fn begin_tensor(header: &TensorHeader<'_>) -> Context {
    let mut ctx = Context::new(&SHA256);
    put_str(&mut ctx, header.name);
    put_str(&mut ctx, header.dtype);
    put_u64(&mut ctx, header.shape.len() as u64);
    for &dim in header.shape {
        put_u64(&mut ctx, dim);
    }
    put_u64(&mut ctx, header.bytes);
    ctx
}

/// The digest of a tensor whose data is in memory (tests, small inputs).
#[cfg(test)]
pub(crate) fn tensor_from_slice(header: &TensorHeader<'_>, data: &[u8]) -> Sha256 {
    assert_eq!(header.bytes, data.len() as u64);
    let mut ctx = begin_tensor(header);
    ctx.update(data);
    finish(ctx)
}

/// The digest of a tensor whose `header.bytes` bytes start at `start` in `file`, read
/// `buf.len()` bytes at a time.
///
/// # Errors
///
/// [`WeightsError::Io`] when reading fails, [`WeightsError::Format`] when the file ends
/// before the tensor does (it shrank after its header was checked).
pub(crate) fn tensor_from_file(
    header: &TensorHeader<'_>,
    file: &mut File,
    path: &Path,
    start: u64,
    buf: &mut [u8],
) -> Result<Sha256, WeightsError> {
    let mut ctx = begin_tensor(header);
    file.seek(SeekFrom::Start(start)).map_err(|e| WeightsError::io(path, e))?;
    let mut left = header.bytes;
    while left > 0 {
        let n = usize::try_from(left).map_or(buf.len(), |left| left.min(buf.len()));
        file.read_exact(&mut buf[..n]).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => WeightsError::format(
                path,
                format!("the file ends inside the data of tensor {:?}", header.name),
            ),
            _ => WeightsError::io(path, e),
        })?;
        ctx.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(finish(ctx))
}

/// The model checksum over `(name, digest)` pairs, which must be sorted by name.
pub(crate) fn checksum<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Sha256)>) -> Sha256 {
    let mut ctx = Context::new(&SHA256);
    for (name, digest) in tensors {
        put_str(&mut ctx, name);
        ctx.update(digest);
    }
    finish(ctx)
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn put_u64(ctx: &mut Context, value: u64) {
    ctx.update(&value.to_le_bytes());
}

fn put_str(ctx: &mut Context, s: &str) {
    put_u64(ctx, s.len() as u64);
    ctx.update(s.as_bytes());
}

fn finish(ctx: Context) -> Sha256 {
    let mut out = [0; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(bytes: &[u8]) -> Sha256 {
        finish({
            let mut ctx = Context::new(&SHA256);
            ctx.update(bytes);
            ctx
        })
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_value() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn tensor_digest_hashes_the_documented_byte_string() {
        let header = TensorHeader { name: "w", dtype: "F32", shape: &[2, 1], bytes: 3 };
        let mut expected = Vec::new();
        expected.extend(1u64.to_le_bytes());
        expected.extend(b"w");
        expected.extend(3u64.to_le_bytes());
        expected.extend(b"F32");
        expected.extend(2u64.to_le_bytes());
        expected.extend(2u64.to_le_bytes());
        expected.extend(1u64.to_le_bytes());
        expected.extend(3u64.to_le_bytes());
        expected.extend([7, 8, 9]);
        assert_eq!(tensor_from_slice(&header, &[7, 8, 9]), sha256(&expected));
    }

    #[test]
    fn checksum_hashes_length_prefixed_names_and_raw_digests() {
        let (a, b) = ([1; 32], [2; 32]);
        let mut expected = Vec::new();
        expected.extend(1u64.to_le_bytes());
        expected.extend(b"a");
        expected.extend(a);
        expected.extend(2u64.to_le_bytes());
        expected.extend(b"bb");
        expected.extend(b);
        assert_eq!(checksum([("a", &a), ("bb", &b)]), sha256(&expected));
    }

    #[test]
    fn data_read_in_chunks_hashes_like_data_in_memory() {
        let dir = std::env::temp_dir().join(format!("hangar-weights-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let header = TensorHeader { name: "t", dtype: "U8", shape: &[990], bytes: 990 };
        let mut file = File::open(&path).unwrap();
        // A 64-byte buffer forces many reads, the last one partial.
        let from_file = tensor_from_file(&header, &mut file, &path, 10, &mut [0; 64]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(from_file, tensor_from_slice(&header, &data[10..]));
    }
}
