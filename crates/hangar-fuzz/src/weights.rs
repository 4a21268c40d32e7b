//! The weights readers on crafted files: the bytes are written to a file of this process's
//! own (on tmpfs when there is one) and read as an admin-named file would be.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use hangar_weights::{WeightsError, digest as digest_of, gguf_shape as shape_of, locate_tensors};

thread_local! {
    /// This thread's scratch files, by extension, made once.
    static FILES: RefCell<Vec<(String, PathBuf)>> = const { RefCell::new(Vec::new()) };
}

/// `data` written to this thread's scratch file ending in `.{extension}`, then `read` on it.
fn with_file<T>(data: &[u8], extension: &str, read: impl FnOnce(&Path) -> T) -> T {
    let path = FILES.with_borrow_mut(|files| {
        if let Some((_, path)) = files.iter().find(|(e, _)| e == extension) {
            return path.clone();
        }
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let thread = format!("{:?}", std::thread::current().id());
        let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
        let name = format!("hangar-fuzz-{}-{thread}.{extension}", std::process::id());
        let path = dir.join(name);
        files.push((extension.to_owned(), path.clone()));
        path
    });
    std::fs::write(&path, data).expect("the scratch file is written");
    read(&path)
}

/// What every reader's answer must satisfy: the tensors it locates lie inside the file,
/// their names are unique, and a failure is a format error (the file exists and is read).
fn check_located(data: &[u8], located: Result<Vec<hangar_weights::TensorLocation>, WeightsError>) {
    let len = data.len() as u64;
    match located {
        Ok(tensors) => {
            assert!(!tensors.is_empty(), "weights without tensors were accepted");
            for t in &tensors {
                assert!(
                    t.range.start <= t.range.end,
                    "{}: a backwards range {:?}",
                    t.name,
                    t.range
                );
                assert!(
                    t.range.end <= len,
                    "{}: {:?} is past the file's {len} bytes",
                    t.name,
                    t.range
                );
            }
            for pair in tensors.windows(2) {
                assert!(pair[0].name < pair[1].name, "not sorted, or `{}` twice", pair[0].name);
            }
        }
        Err(error) => assert_format(&error),
    }
}

/// A crafted file that the reader refuses must be refused for its contents, never for I/O.
fn assert_format(error: &WeightsError) {
    assert!(
        !matches!(error, WeightsError::Io { .. }),
        "a readable file was refused as unreadable: {error}"
    );
    assert!(!error.to_string().is_empty());
}

/// `locate_tensors` on a GGUF file.
pub(crate) fn gguf(data: &[u8]) {
    with_file(data, "gguf", |path| check_located(data, locate_tensors(path)));
}

/// `locate_tensors` on a safetensors file.
pub(crate) fn safetensors(data: &[u8]) {
    with_file(data, "safetensors", |path| check_located(data, locate_tensors(path)));
}

/// `gguf_shape` and the KV-cache estimate over every cache type and a range of contexts:
/// no panic, no overflow (the arithmetic saturates), and a larger context never costs less.
pub(crate) fn gguf_shape(data: &[u8]) {
    let shape = with_file(data, "gguf", shape_of);
    let shape = match shape {
        Ok(shape) => shape,
        Err(error) => return assert_format(&error),
    };
    assert!(!shape.head_count_kv.is_empty(), "a shape without layers: {shape:?}");
    for ty in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] {
        let mut last = 0;
        for n_ctx in [0, 1, 512, 131_072, u64::MAX] {
            let bytes =
                shape.kv_cache_bytes(n_ctx, ty, "f16").expect("a cache type llama.cpp takes");
            assert!(bytes >= last, "{ty}: {n_ctx} tokens cost {bytes}, fewer than {last}");
            last = bytes;
        }
    }
    assert_eq!(shape.kv_cache_bytes(1, "q3_k", "f16"), None, "not a cache type");
}

/// `digest` of a crafted file (GGUF, or safetensors when the input starts with the 8-byte
/// header length of one): the tensors it hashes are those `locate_tensors` finds, their
/// bytes add up, and digesting again gives the same checksum.
pub(crate) fn digest(data: &[u8]) {
    let extension = if looks_like_safetensors(data) { "safetensors" } else { "gguf" };
    with_file(data, extension, |path| {
        let first = match digest_of(path) {
            Ok(first) => first,
            Err(error) => {
                assert_format(&error);
                assert!(locate_tensors(path).is_err(), "located but not digested: {error}");
                return;
            }
        };
        let located = locate_tensors(path).expect("digested, so located");
        assert_eq!(first.tensors.len(), located.len());
        let sum: u64 = first.tensors.iter().map(|t| t.bytes).sum();
        assert_eq!(first.bytes, sum);
        assert!(first.bytes <= data.len() as u64);
        let again = digest_of(path).expect("digested once, digested again");
        assert_eq!(first.checksum, again.checksum);
    });
}

/// Whether `data` starts as a safetensors file does: a little-endian header length that
/// fits the file, then `{`.
fn looks_like_safetensors(data: &[u8]) -> bool {
    let Some(len) = data.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else { return false };
    let len = u64::from_le_bytes(len);
    len < data.len() as u64 && data.get(8) == Some(&b'{')
}
