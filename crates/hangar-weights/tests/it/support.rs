//! Helpers shared by the integration tests: temporary directories, file builders and an
//! independent implementation of the documented digest encoding.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `fixtures/models/<name>` at the workspace root.
pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models").join(name)
}

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(label: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("hangar-weights-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `bytes` to `name` in this directory and returns the file's path.
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Flips every bit of the byte at `offset` in the file at `path`.
pub(crate) fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[usize::try_from(offset).unwrap()] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// SHA-256 as lowercase hex, with no help from the crate.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// The documented tensor digest, computed independently of the crate.
pub(crate) fn expected_tensor_digest(
    name: &str,
    dtype: &str,
    shape: &[u64],
    data: &[u8],
) -> String {
    let mut message = Vec::new();
    push_str(&mut message, name);
    push_str(&mut message, dtype);
    message.extend((shape.len() as u64).to_le_bytes());
    for dim in shape {
        message.extend(dim.to_le_bytes());
    }
    message.extend((data.len() as u64).to_le_bytes());
    message.extend(data);
    sha256_hex(&message)
}

/// The documented model checksum over `(name, hex digest)` pairs, computed independently.
pub(crate) fn expected_checksum(tensors: &[(&str, &str)]) -> String {
    let mut sorted = tensors.to_vec();
    sorted.sort();
    let mut message = Vec::new();
    for (name, hex) in sorted {
        push_str(&mut message, name);
        for i in (0..hex.len()).step_by(2) {
            message.push(u8::from_str_radix(&hex[i..i + 2], 16).unwrap());
        }
    }
    sha256_hex(&message)
}

/// One tensor of a hand-built safetensors file.
pub(crate) struct StTensor<'a> {
    pub(crate) name: &'a str,
    pub(crate) dtype: &'a str,
    pub(crate) shape: &'a [u64],
    pub(crate) data: &'a [u8],
}

/// A safetensors file holding `tensors`, their data laid out in order.
pub(crate) fn safetensors_bytes(tensors: &[StTensor<'_>]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.data.len() as u64;
        header.insert(
            t.name.into(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    safetensors_with_header(&serde_json::Value::Object(header).to_string(), tensors)
}

/// A safetensors file with this JSON header and the tensors' data after it.
pub(crate) fn safetensors_with_header(header: &str, tensors: &[StTensor<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend((header.len() as u64).to_le_bytes());
    out.extend(header.as_bytes());
    for t in tensors {
        out.extend(t.data);
    }
    out
}

/// One tensor info of a hand-built GGUF file.
pub(crate) struct GgufTensor<'a> {
    pub(crate) name: &'a str,
    pub(crate) dims: &'a [u64],
    pub(crate) ggml_type: u32,
    pub(crate) offset: u64,
}

/// A metadata pair: key, value type, encoded value.
pub(crate) fn kv(key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_str(&mut out, key);
    out.extend(value_type.to_le_bytes());
    out.extend(value);
    out
}

/// A metadata string pair.
pub(crate) fn kv_string(key: &str, value: &str) -> Vec<u8> {
    let mut encoded = Vec::new();
    push_str(&mut encoded, value);
    kv(key, 8, &encoded)
}

/// A hand-built GGUF file: the header fields as given, the metadata pairs, the tensor
/// infos, zero padding to `alignment`, then `data`.
pub(crate) struct Gguf<'a> {
    pub(crate) magic: &'a [u8; 4],
    pub(crate) version: u32,
    /// The stated tensor count; `None` states the number of `tensors`.
    pub(crate) tensor_count: Option<u64>,
    /// The stated key/value count; `None` states the number of `kvs`.
    pub(crate) kv_count: Option<u64>,
    pub(crate) kvs: Vec<Vec<u8>>,
    pub(crate) tensors: &'a [GgufTensor<'a>],
    pub(crate) alignment: usize,
    pub(crate) data: &'a [u8],
}

impl Default for Gguf<'_> {
    /// One F32 tensor `w` of four elements, all bytes 1, and one string pair.
    fn default() -> Self {
        Self {
            magic: b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: vec![kv_string("general.architecture", "llama")],
            tensors: &[GgufTensor { name: "w", dims: &[4], ggml_type: 0, offset: 0 }],
            alignment: 32,
            data: &[1; 16],
        }
    }
}

impl Gguf<'_> {
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(self.magic);
        out.extend(self.version.to_le_bytes());
        out.extend(self.tensor_count.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for pair in &self.kvs {
            out.extend(pair);
        }
        for t in self.tensors {
            push_str(&mut out, t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(t.offset.to_le_bytes());
        }
        while out.len() % self.alignment != 0 {
            out.push(0);
        }
        out.extend(self.data);
        out
    }
}

/// `result` (of reading `path`) is a format error naming the file whose message contains
/// `needle`.
pub(crate) fn check_format<T: std::fmt::Debug>(
    result: Result<T, hangar_weights::WeightsError>,
    path: &std::path::Path,
    needle: &str,
) {
    match result {
        Err(err @ hangar_weights::WeightsError::Format { .. }) => {
            let text = err.to_string();
            assert!(text.contains(&path.display().to_string()), "names the file: {text}");
            assert!(text.contains(needle), "{text:?} should mention {needle:?}");
        }
        other => panic!("{}: expected a format error, got {other:?}", path.display()),
    }
}
