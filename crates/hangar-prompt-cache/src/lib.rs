//! Hangar's saved prompt caches: what an engine computed for a conversation's prompt (its
//! per-sequence KV state), kept on disk when the model unloads or sleeps, so that the next
//! turn of that conversation after a swap computes only what is new.
//!
//! This crate owns the store: where saved caches live (one folder per model under a root
//! in `state_dir`), how one is found (Hangar's APIs are stateless, so a conversation is its
//! token prefix: a cache is keyed by a digest of the tokens it covers and found by the
//! longest prefix it shares with a new prompt), what ties it to a model ([`Identity`]: a
//! digest of the whole model file, remembered by its inode, size and modification time,
//! and the engine's load options; a cache of another identity is never handed out, and
//! the log says so), the byte bound
//! over the whole root (oldest dropped first), and the file rules (`file`: folders 0700,
//! files 0600, no symlink followed, digests checked before a payload is handed out). What
//! a payload holds is the engine's business: the store never interprets it.
//!
//! I/O is synchronous; engines call it from their own worker threads.

use std::path::{Path, PathBuf};

use ring::digest::{Context, SHA256};

mod file;

pub use file::{EXT, PAYLOAD_EXT};

/// Fewer cached tokens than this are not worth a file: engines save no shorter prefix.
pub const MIN_TOKENS: usize = 64;

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file system refused.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A folder or file that the store will not use: a symlink, another user's folder.
    #[error("{}: {why}", path.display())]
    Unsafe {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A file that is no saved cache of this format, or changed since it was listed.
    #[error("{}: {why}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// What a saved cache is tied to: a SHA-256 over the whole model file and the engine's
/// load options as the engine writes them. Two loads restore each other's caches only when
/// both agree: two files of the same size, head and tail that differ anywhere else do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity([u8; 32]);

/// A file as its digest is remembered: device, inode, size and modification time. A file
/// changed in place or replaced changes one of them, and is read again; so is one whose
/// first or last MiB changed within the clock's resolution (checked at every use).
type FileKey = (u64, u64, u64, i64, i64);

/// A remembered digest: the file's key, the digest of its first and last MiB, and of it all.
type Remembered = (FileKey, [u8; 32], [u8; 32]);

/// The digests of the model files read so far in this process.
static DIGESTS: std::sync::Mutex<Vec<Remembered>> = std::sync::Mutex::new(Vec::new());

/// How much of a file's head and tail is checked again when its digest is reused.
const EDGE: u64 = 1 << 20;

impl Identity {
    /// The identity of `model_file` loaded with `options`. The file is read whole once per
    /// process (for a model of gigabytes, seconds: call it off the async threads); later
    /// calls for the same unchanged file reuse its digest.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub fn of(model_file: &Path, options: &str) -> Result<Self, CacheError> {
        let mut ctx = Context::new(&SHA256);
        ctx.update(b"hangar-prompt-cache 2\0");
        ctx.update(&file_digest(model_file)?);
        ctx.update(&(options.len() as u64).to_le_bytes());
        ctx.update(options.as_bytes());
        Ok(Self::from_digest(ctx.finish().as_ref()))
    }

    fn from_digest(bytes: &[u8]) -> Self {
        let mut id = [0u8; 32];
        id.copy_from_slice(&bytes[..32]);
        Self(id)
    }
}

/// The SHA-256 of `path`'s bytes, remembered by [`FileKey`] and its edges.
fn file_digest(path: &Path) -> Result<[u8; 32], CacheError> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let io = |e| file::io_at(path, e);
    let mut f = std::fs::File::open(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec());
    let mut edges = Context::new(&SHA256);
    let mut buf = vec![0u8; EDGE.min(meta.size()) as usize];
    f.read_exact(&mut buf).map_err(io)?;
    edges.update(&buf);
    f.seek(SeekFrom::Start(meta.size() - buf.len() as u64)).map_err(io)?;
    f.read_exact(&mut buf).map_err(io)?;
    edges.update(&buf);
    let edges: [u8; 32] = edges.finish().as_ref().try_into().unwrap_or_default();
    let lock = || DIGESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let remembered = lock().iter().find(|(k, e, _)| *k == key && *e == edges).map(|r| r.2);
    if let Some(digest) = remembered {
        return Ok(digest);
    }
    f.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    let digest: [u8; 32] = ctx.finish().as_ref().try_into().unwrap_or_default();
    let mut digests = lock();
    // A file replaced keeps no stale entry for its inode.
    digests.retain(|((dev, ino, ..), ..)| (*dev, *ino) != (key.0, key.1));
    digests.push((key, edges, digest));
    Ok(digest)
}

/// What [`Store::save_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saving {
    /// Written: this many bytes (header and payload).
    Saved(u64),
    /// Not written: a saved cache already covers these tokens (they are its prefix).
    Covered,
    /// Not written: alone it is over the store's byte bound.
    TooLarge,
}

/// A saved cache of this store's identity.
#[derive(Debug, Clone)]
struct Saved {
    /// `<key>.hpc`; the payload is `<key>.bin`.
    path: PathBuf,
    header: file::Header,
    /// When it was saved (its header's modification time).
    modified: std::time::SystemTime,
}

impl Saved {
    fn payload(&self) -> PathBuf {
        self.path.with_extension(file::PAYLOAD_EXT)
    }
}

/// One model's saved caches, under a root whose byte bound covers every model's.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    dir: PathBuf,
    max_bytes: u64,
    identity: Identity,
    saved: Vec<Saved>,
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A file-name-safe form of `model`: its safe characters and a digest of the whole name.
fn folder_name(model: &str) -> String {
    let safe: String = model
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(64)
        .collect();
    let digest = ring::digest::digest(&SHA256, model.as_bytes());
    format!("{safe}-{}", hex(&digest.as_ref()[..4]))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Files younger than this may belong to a save in progress in another replica.
const STALE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes a saved cache's header and payload (either may be missing).
fn remove(header: &Path) {
    let _ = std::fs::remove_file(header.with_extension(file::PAYLOAD_EXT));
    let _ = std::fs::remove_file(header.with_extension(file::EXT));
}

impl Store {
    /// Opens `model`'s saved caches under `root` (both folders created 0700), keeping those
    /// of `identity`; caches of another identity are logged and left for the byte bound;
    /// unreadable ones, and stale temporary files and payloads without a header, removed.
    ///
    /// # Errors
    /// When a folder cannot be created, is a symlink or is another user's.
    pub fn open(
        root: &Path,
        model: &str,
        identity: Identity,
        max_bytes: u64,
    ) -> Result<Self, CacheError> {
        file::private_dir(root)?;
        let dir = root.join(folder_name(model));
        file::private_dir(&dir)?;
        let mut saved = Vec::new();
        let mut foreign = 0usize;
        let stale = std::time::SystemTime::now() - STALE;
        for (path, _, modified, tmp) in file::list(&dir) {
            let header = path.extension().is_some_and(|e| e == file::EXT);
            if tmp || !header {
                if modified < stale && (tmp || !path.with_extension(file::EXT).exists()) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            match file::read_header(&path) {
                Ok(header) if header.identity == identity => {
                    saved.push(Saved { path, header, modified });
                }
                Ok(_) => foreign += 1,
                Err(e) => {
                    tracing::warn!(model, error = %e, "unreadable saved prompt cache removed");
                    remove(&path);
                }
            }
        }
        if foreign > 0 {
            tracing::warn!(
                model,
                foreign,
                "saved prompt caches made from another model file or other load options: not restored"
            );
        }
        Ok(Self { root: root.to_owned(), dir, max_bytes, identity, saved })
    }

    /// How many caches of this identity are saved.
    #[must_use]
    pub fn len(&self) -> usize {
        self.saved.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.saved.is_empty()
    }

    /// The saved cache sharing the longest prefix with `prompt`, when that is longer than
    /// `beat`: its index and how many tokens it shares.
    #[must_use]
    pub fn best(&self, prompt: &[i32], beat: usize) -> Option<(usize, usize)> {
        self.saved
            .iter()
            .enumerate()
            .map(|(i, s)| (common_prefix(&s.header.tokens, prompt), i))
            .filter(|&(shared, _)| shared > beat)
            .max()
            .map(|(shared, i)| (i, shared))
    }

    /// The saved caches, most recently saved first (at most `n`).
    #[must_use]
    pub fn recent(&self, n: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.saved.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.saved[i].modified));
        order.truncate(n);
        order
    }

    /// The engine's files of the `n` most recently saved caches, most recent first, each
    /// checked as [`Store::payload`] checks it (a cache that fails is logged and forgotten).
    pub fn recent_payloads(&mut self, n: usize) -> Vec<PathBuf> {
        let headers: Vec<PathBuf> =
            self.recent(n).into_iter().map(|i| self.saved[i].path.clone()).collect();
        headers
            .into_iter()
            .filter_map(|header| {
                let index = self.saved.iter().position(|s| s.path == header)?;
                self.payload(index)
                    .map_err(|e| tracing::warn!(error = %e, "a saved prompt cache is not used"))
                    .ok()
            })
            .collect()
    }

    /// The tokens saved cache `index` covers.
    #[must_use]
    pub fn tokens(&self, index: usize) -> &[i32] {
        self.saved.get(index).map_or(&[], |s| &s.header.tokens)
    }

    /// The engine's file of saved cache `index`, its size and digest checked against the
    /// header. A cache that fails (gone to the byte bound, changed, corrupt) is forgotten.
    ///
    /// # Errors
    /// Why it cannot be used.
    pub fn payload(&mut self, index: usize) -> Result<PathBuf, CacheError> {
        let Some(saved) = self.saved.get(index) else {
            return Err(CacheError::Format { path: self.dir.clone(), why: "no such saved cache" });
        };
        let payload = saved.payload();
        match file::verify_payload(&payload, &saved.header) {
            Ok(()) => Ok(payload),
            Err(e) => {
                let gone = self.saved.swap_remove(index);
                if !matches!(e, CacheError::Io { .. }) {
                    remove(&gone.path);
                }
                Err(e)
            }
        }
    }

    /// Forgets saved cache `index` and removes its files (the engine refused it).
    pub fn discard(&mut self, index: usize) {
        if index < self.saved.len() {
            remove(&self.saved.swap_remove(index).path);
        }
    }

    /// Saves the engine's state for `tokens`, unless a saved cache already covers them:
    /// `write` gets a new empty file (0600, in this model's folder) and writes the state
    /// into it, returning false when it could not. Saved caches that `tokens` extend are
    /// dropped, then the oldest under the root until it is within its byte bound.
    ///
    /// # Errors
    /// When the files cannot be created or checked.
    pub fn save_with(
        &mut self,
        tokens: &[i32],
        write: impl FnOnce(&Path) -> bool,
    ) -> Result<Saving, CacheError> {
        if self.covers(tokens) {
            return Ok(Saving::Covered);
        }
        let tmp = self.temporary()?;
        if !write(&tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Err(CacheError::Format { path: tmp, why: "the engine could not write it" });
        }
        self.commit(tokens, &tmp)
    }

    /// Whether a saved cache covers `tokens` (they are its prefix).
    #[must_use]
    pub fn covers(&self, tokens: &[i32]) -> bool {
        self.saved.iter().any(|s| s.header.tokens.starts_with(tokens))
    }

    /// This model's folder: engines that write their own files (`llama-server`'s
    /// `--slot-save-path`) write there.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new empty file (0600) in this model's folder for an engine to write a payload
    /// into, then [`Store::commit`] it (or remove it).
    ///
    /// # Errors
    /// When it cannot be created.
    pub fn temporary(&self) -> Result<PathBuf, CacheError> {
        file::temporary(&self.dir, file::PAYLOAD_EXT)
    }

    /// Keeps `tmp` (a [`Store::temporary`] the engine wrote) as the saved cache of `tokens`,
    /// unless one already covers them or it is over the bound (it is then removed); saved
    /// caches `tokens` extend are dropped, then the oldest under the root until it is within
    /// its byte bound.
    ///
    /// # Errors
    /// When the files cannot be checked, renamed or written (`tmp` is then removed).
    pub fn commit(&mut self, tokens: &[i32], tmp: &Path) -> Result<Saving, CacheError> {
        let committed = self.keep(tokens, tmp);
        if !matches!(committed, Ok(Saving::Saved(_))) {
            let _ = std::fs::remove_file(tmp);
        }
        committed
    }

    fn keep(&mut self, tokens: &[i32], tmp: &Path) -> Result<Saving, CacheError> {
        if self.covers(tokens) {
            return Ok(Saving::Covered);
        }
        let (payload_len, payload_sha256) = file::digest_file(tmp)?;
        let bytes = file::HEADER + 4 * tokens.len() as u64 + payload_len;
        if bytes > self.max_bytes {
            return Ok(Saving::TooLarge);
        }
        let mut key = Context::new(&SHA256);
        key.update(&self.identity.0);
        for t in tokens {
            key.update(&t.to_le_bytes());
        }
        let path = self.dir.join(format!("{}.{}", hex(&key.finish().as_ref()[..16]), file::EXT));
        let header = file::Header {
            identity: self.identity,
            tokens: tokens.to_vec(),
            payload_len,
            payload_sha256,
        };
        std::fs::rename(tmp, path.with_extension(file::PAYLOAD_EXT))
            .map_err(|e| file::io_at(tmp, e))?;
        let written = file::write_header(&path, &header)? + payload_len;
        let (extended, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.saved)
            .into_iter()
            .partition(|s| tokens.starts_with(&s.header.tokens) && s.path != path);
        for old in extended {
            remove(&old.path);
        }
        self.saved = kept;
        self.saved.retain(|s| s.path != path);
        self.saved.push(Saved { path, header, modified: std::time::SystemTime::now() });
        self.bound();
        Ok(Saving::Saved(written))
    }

    /// Drops the oldest saved caches of every model under the root (header and payload
    /// together) until their bytes are within the bound.
    fn bound(&mut self) {
        let Ok(models) = std::fs::read_dir(&self.root) else { return };
        let mut caches: std::collections::BTreeMap<PathBuf, (u64, std::time::SystemTime)> =
            std::collections::BTreeMap::new();
        for (path, bytes, modified, tmp) in models
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .flat_map(|e| file::list(&e.path()))
        {
            if !tmp {
                let cache = caches.entry(path.with_extension(file::EXT)).or_insert((0, modified));
                cache.0 += bytes;
                cache.1 = cache.1.min(modified);
            }
        }
        let mut total: u64 = caches.values().map(|(bytes, _)| bytes).sum();
        let mut oldest: Vec<_> = caches.into_iter().collect();
        oldest.sort_by_key(|(path, (_, modified))| (*modified, path.clone()));
        for (path, (bytes, _)) in oldest {
            if total <= self.max_bytes {
                break;
            }
            remove(&path);
            total = total.saturating_sub(bytes);
            self.saved.retain(|s| s.path != path);
        }
    }
}

/// The default byte bound of a root on the file system of `dir`: 2% of that file system,
/// at most 32 GiB (1 GiB when its size cannot be read).
#[must_use]
pub fn default_max_bytes(dir: &Path) -> u64 {
    const CAP: u64 = 32 << 30;
    let mut probe = dir;
    while !probe.exists() {
        match probe.parent() {
            Some(parent) => probe = parent,
            None => break,
        }
    }
    match nix::sys::statvfs::statvfs(probe) {
        Ok(fs) => fs.blocks().saturating_mul(fs.fragment_size()).div_ceil(50).min(CAP),
        Err(_) => 1 << 30,
    }
}
