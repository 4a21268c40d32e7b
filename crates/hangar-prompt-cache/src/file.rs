//! One saved prompt cache on disk, and the file system rules every file of the store
//! follows: folders 0700, files created 0600 with `O_EXCL` and `O_NOFOLLOW` under a
//! temporary name and renamed into place, read back only through `O_NOFOLLOW`.
//!
//! A saved cache is two files: `<key>.hpc`, the store's header, and `<key>.bin`, the
//! engine's own state file (llama.cpp's sequence state file, `llama-server`'s slot file),
//! which the engine writes into a temporary file the store created. The header
//! (integers little-endian):
//!
//! ```text
//! magic "HANGARPC" | version u32 = 2 | identity [32] | n_tokens u64 | payload_len u64
//! | sha256(payload) [32] | tokens: n_tokens × i32
//! ```
//!
//! Every length is checked against the file's size before anything is allocated, so a
//! truncated or forged header is [`CacheError::Format`], never a panic or a huge
//! allocation; a payload reaches the engine only when its size and digest match the header.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;
use ring::digest::SHA256;

use crate::{CacheError, Identity};

const MAGIC: &[u8; 8] = b"HANGARPC";
const VERSION: u32 = 2;
/// Bytes before the tokens.
pub(crate) const HEADER: u64 = 8 + 4 + 32 + 8 + 8 + 32;
/// The file extension of saved caches' headers (temporary files start with `tmp-`).
pub const EXT: &str = "hpc";
/// The file extension of their payloads, the engine's own files.
pub const PAYLOAD_EXT: &str = "bin";
/// Temporary files' prefix: no leading dot, so that `llama-server`, which refuses some
/// names, takes one as the file to save a slot into.
pub(crate) const TMP: &str = "tmp-";

/// A saved cache's header and tokens (its payload stays on disk until read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) identity: Identity,
    pub(crate) tokens: Vec<i32>,
    pub(crate) payload_len: u64,
    pub(crate) payload_sha256: [u8; 32],
}

/// Creates `dir` (and its parents) 0700 and checks that it is a real folder of this user,
/// not a symlink.
pub(crate) fn private_dir(dir: &Path) -> Result<(), CacheError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_at(dir, e))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| io_at(dir, e))?;
    if !meta.file_type().is_dir() {
        return Err(CacheError::Unsafe { path: dir.to_owned(), why: "not a folder (a symlink?)" });
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(CacheError::Unsafe { path: dir.to_owned(), why: "owned by another user" });
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| io_at(dir, e))?;
    }
    Ok(())
}

/// A new empty file in `dir` under a temporary name, created 0600 without following a
/// symlink (an engine then writes into it: opening an existing file keeps its mode).
pub(crate) fn temporary(dir: &Path, ext: &str) -> Result<PathBuf, CacheError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{TMP}{}-{n}.{ext}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .map_err(|e| io_at(&tmp, e))?;
    Ok(tmp)
}

/// Writes `header` as `path`: a temporary file, synced, renamed over `path`. Its bytes.
pub(crate) fn write_header(path: &Path, header: &Header) -> Result<u64, CacheError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = temporary(dir, EXT)?;
    let written = (|| {
        let mut file =
            OpenOptions::new().write(true).custom_flags(OFlag::O_NOFOLLOW.bits()).open(&tmp)?;
        let mut head = Vec::with_capacity(HEADER as usize + header.tokens.len() * 4);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&header.identity.0);
        head.extend_from_slice(&(header.tokens.len() as u64).to_le_bytes());
        head.extend_from_slice(&header.payload_len.to_le_bytes());
        head.extend_from_slice(&header.payload_sha256);
        for t in &header.tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        file.write_all(&head)?;
        file.sync_data()?;
        std::fs::rename(&tmp, path)?;
        Ok::<_, io::Error>(head.len() as u64)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| io_at(path, e))
}

/// The size and SHA-256 of the regular file `path` (not followed if a symlink).
pub(crate) fn digest_file(path: &Path) -> Result<(u64, [u8; 32]), CacheError> {
    let (mut file, size) = open(path)?;
    let mut ctx = ring::digest::Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    let mut seen = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| io_at(path, e))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
        seen += n as u64;
    }
    if seen != size {
        return Err(CacheError::Format { path: path.to_owned(), why: "changed while it was read" });
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    Ok((size, out))
}

/// Opens `path` for reading without following a symlink; its size.
fn open(path: &Path) -> Result<(File, u64), CacheError> {
    let file =
        OpenOptions::new().read(true).custom_flags(OFlag::O_NOFOLLOW.bits()).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(code) if code == nix::errno::Errno::ELOOP as i32 => {
                    CacheError::Unsafe { path: path.to_owned(), why: "a symlink" }
                }
                _ => io_at(path, e),
            },
        )?;
    let meta = file.metadata().map_err(|e| io_at(path, e))?;
    if !meta.is_file() {
        return Err(CacheError::Unsafe { path: path.to_owned(), why: "not a regular file" });
    }
    Ok((file, meta.len()))
}

/// Reads `path`'s header and tokens, checked against the file's size.
pub(crate) fn read_header(path: &Path) -> Result<Header, CacheError> {
    let (mut file, size) = open(path)?;
    read_header_from(&mut file, size, path)
}

fn read_header_from(file: &mut File, size: u64, path: &Path) -> Result<Header, CacheError> {
    let bad = |why: &'static str| CacheError::Format { path: path.to_owned(), why };
    if size < HEADER {
        return Err(bad("shorter than a header"));
    }
    let mut head = [0u8; HEADER as usize];
    file.read_exact(&mut head).map_err(|e| io_at(path, e))?;
    if &head[..8] != MAGIC {
        return Err(bad("not a saved prompt cache"));
    }
    if u32::from_le_bytes(head[8..12].try_into().unwrap_or_default()) != VERSION {
        return Err(bad("another format version"));
    }
    let mut identity = [0u8; 32];
    identity.copy_from_slice(&head[12..44]);
    let n_tokens = u64::from_le_bytes(head[44..52].try_into().unwrap_or_default());
    let payload_len = u64::from_le_bytes(head[52..60].try_into().unwrap_or_default());
    let mut payload_sha256 = [0u8; 32];
    payload_sha256.copy_from_slice(&head[60..92]);
    let expected = n_tokens.checked_mul(4).and_then(|t| t.checked_add(HEADER));
    if expected != Some(size) {
        return Err(bad("its lengths do not add up to its size"));
    }
    let mut raw = vec![0u8; (n_tokens * 4) as usize];
    file.read_exact(&mut raw).map_err(|e| io_at(path, e))?;
    let tokens =
        raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Header { identity: Identity(identity), tokens, payload_len, payload_sha256 })
}

/// Checks that `payload` is the file `header` describes: its size and digest.
pub(crate) fn verify_payload(payload: &Path, header: &Header) -> Result<(), CacheError> {
    let (size, sha256) = digest_file(payload)?;
    if size != header.payload_len || sha256 != header.payload_sha256 {
        return Err(CacheError::Format {
            path: payload.to_owned(),
            why: "its payload's digest differs",
        });
    }
    Ok(())
}

/// The saved caches and stale temporary files directly in `dir`: (path, bytes, modified).
pub(crate) fn list(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let name = path.file_name()?.to_str()?;
            let tmp = name.starts_with(TMP);
            let saved = path.extension().is_some_and(|e| e == EXT || e == PAYLOAD_EXT);
            let meta = entry.metadata().ok()?; // does not follow a symlink
            (meta.is_file() && (tmp || saved)).then(|| {
                let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                (path, meta.len(), modified, tmp)
            })
        })
        .collect()
}

pub(crate) fn io_at(path: &Path, source: io::Error) -> CacheError {
    CacheError::Io { path: path.to_owned(), source }
}
