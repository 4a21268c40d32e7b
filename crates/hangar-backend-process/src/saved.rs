//! Prompt caches across a swap for `llama-server` children (`hangar-prompt-cache`).
//!
//! The child starts with `--slot-save-path` on the model's folder of the store (0700,
//! Hangar's). Before it stops, every slot is saved (`POST /slots/{id}?action=save`) into a
//! file the store created, not only the last used one; the tokens a file covers are read
//! from its head (llama.cpp's sequence state file), and the store keeps it unless a saved
//! cache already covers them, or it holds fewer than [`MIN_TOKENS`]. Once a new child is
//! ready, the most recent caches are restored into its slots (`action=restore`), their
//! digests checked first; `llama-server` then seats a returning conversation in the slot
//! whose prompt it shares (its `--slot-prompt-similarity`).
//!
//! A cache is tied to the GGUF and to every argument of the child but its address, and to
//! the binary (its path, size and modification time: another build may write another
//! state format); `llama-server` checks a state's shape as it reads it.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::PromptCacheRoot;
use hangar_prompt_cache::{Identity, MIN_TOKENS, Saving, Store};
use http::Method;

use crate::launch::Launch;
use crate::upstream::Upstream;

/// llama.cpp's sequence state file magic, `ggsq`.
const SEQ_MAGIC: u32 = 0x6767_7371;
/// How long one slot's save or restore may take (a child that lets one pass is asked
/// nothing more: an unload waits at most this long for a hung child).
const SLOT_TIMEOUT: Duration = Duration::from_secs(30);

/// A `llama-server` replica's saved prompt caches.
pub(crate) struct SavedSlots {
    store: Arc<Mutex<Store>>,
    slots: u32,
}

/// The arguments that make a cache: every one but the address the child listens on.
fn options(launch: &Launch) -> String {
    let mut kept = Vec::new();
    let mut args = launch.args.iter();
    while let Some(arg) = args.next() {
        if matches!(arg.as_str(), "--host" | "--port" | "--alias") {
            args.next();
            continue;
        }
        kept.push(arg.as_str());
    }
    let binary = std::fs::metadata(&launch.program).ok();
    let stamp = binary.as_ref().map(|m| (m.len(), m.modified().ok()));
    format!("llama-server {} {stamp:?}; {}", launch.program, kept.join(" "))
}

impl SavedSlots {
    /// Opens `model`'s store for `launch` (a `llama-server` of `slots` slots); `None`
    /// (logged) when it cannot be opened.
    pub(crate) fn open(
        root: &PromptCacheRoot,
        model: &str,
        model_file: &Path,
        launch: &Launch,
        slots: u32,
    ) -> Option<Self> {
        let opened = Identity::of(model_file, &options(launch))
            .and_then(|identity| Store::open(&root.dir, model, identity, root.max_bytes));
        let store = match opened {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!(model, error = %e, "saved prompt caches unavailable");
                return None;
            }
        };
        Some(Self { store: Arc::new(Mutex::new(store)), slots })
    }

    /// Points the child of `launch` at the store (`--slot-save-path`).
    pub(crate) fn point(&self, launch: &mut Launch) {
        let store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        let mut dir = store.dir().display().to_string();
        dir.push('/');
        launch.args.extend(["--slot-save-path".to_owned(), dir]);
    }

    /// Restores the most recent saved caches into the child's slots, one each.
    pub(crate) async fn restore(&self, upstream: &Upstream) {
        let store = Arc::clone(&self.store);
        let slots = self.slots as usize;
        let payloads = tokio::task::spawn_blocking(move || {
            store.lock().unwrap_or_else(PoisonError::into_inner).recent_payloads(slots)
        })
        .await
        .unwrap_or_default();
        for (slot, payload) in payloads.iter().enumerate() {
            let Some(name) = payload.file_name().and_then(|n| n.to_str()) else { continue };
            let url = slot_url(upstream, slot, "restore");
            let body = Bytes::from(serde_json::json!({ "filename": name }).to_string());
            match upstream.call(Method::POST, &url, body, SLOT_TIMEOUT).await {
                Ok((200, _)) => tracing::info!(slot, "saved prompt cache restored"),
                Ok((status, body)) => tracing::warn!(
                    slot,
                    status,
                    answer = %String::from_utf8_lossy(&body),
                    "llama-server refused a saved prompt cache"
                ),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "restoring a prompt cache failed");
                    break;
                }
            }
        }
    }

    /// Saves every slot of the child into the store (called before it stops).
    pub(crate) async fn save(&self, upstream: &Upstream) {
        let started = std::time::Instant::now();
        let (mut saved, mut bytes) = (0usize, 0u64);
        for slot in 0..self.slots {
            let tmp = match self.store.lock().unwrap_or_else(PoisonError::into_inner).temporary() {
                Ok(tmp) => tmp,
                Err(e) => {
                    tracing::warn!(error = %e, "a prompt cache could not be saved");
                    return;
                }
            };
            let name = tmp.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            let url = slot_url(upstream, slot as usize, "save");
            let body = Bytes::from(serde_json::json!({ "filename": name }).to_string());
            let answered = upstream.call(Method::POST, &url, body, SLOT_TIMEOUT).await;
            if let Err(e) = &answered {
                // A child that does not answer is not asked again: the unload goes on.
                tracing::warn!(slot, error = %e, "llama-server did not save its slots");
                let _ = std::fs::remove_file(&tmp);
                break;
            }
            let store = Arc::clone(&self.store);
            let kept = tokio::task::spawn_blocking(move || {
                let tokens = match answered {
                    Ok((200, _)) => state_tokens(&tmp).filter(|t| t.len() >= MIN_TOKENS),
                    _ => None,
                };
                let Some(tokens) = tokens else {
                    let _ = std::fs::remove_file(&tmp);
                    return None;
                };
                let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
                match store.commit(&tokens, &tmp) {
                    Ok(Saving::Saved(n)) => Some(n),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!(error = %e, "a prompt cache could not be saved");
                        None
                    }
                }
            })
            .await;
            if let Ok(Some(n)) = kept {
                saved += 1;
                bytes += n;
            }
        }
        if saved > 0 {
            let ms = started.elapsed().as_millis() as u64;
            tracing::info!(saved, bytes, ms, "prompt caches saved");
        }
    }
}

/// `llama-server`'s slot action route (beside its `/v1`).
fn slot_url(upstream: &Upstream, slot: usize, action: &str) -> String {
    let origin = upstream.base.strip_suffix("/v1").unwrap_or(&upstream.base);
    format!("{origin}/slots/{slot}?action={action}")
}

/// The tokens a llama.cpp sequence state file covers: `magic | version | n | n tokens`,
/// the tokens either plain or `llama-server`'s packed form (`-1 | version 1 | count |
/// tokens | media count`, text only). `None` for anything else, or a file shorter than it
/// says.
pub(crate) fn state_tokens(path: &Path) -> Option<Vec<i32>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let size = file.metadata().ok()?.len();
    let mut head = [0u8; 12];
    file.read_exact(&mut head).ok()?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let n = u64::from(word(8));
    if word(0) != SEQ_MAGIC || 12 + 4 * n > size {
        return None;
    }
    let mut raw = vec![0u8; (4 * n) as usize];
    file.read_exact(&mut raw).ok()?;
    let packed: Vec<i32> =
        raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    match packed.first() {
        Some(-1) => {
            let (version, count) = (*packed.get(1)?, usize::try_from(*packed.get(2)?).ok()?);
            let tokens = packed.get(3..3 + count)?;
            let media = *packed.get(3 + count)?;
            (version == 1 && media == 0).then(|| tokens.to_vec())
        }
        _ => Some(packed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq_file(dir: &Path, packed: &[i32]) -> std::path::PathBuf {
        let mut bytes = Vec::new();
        for word in [SEQ_MAGIC, 2, packed.len() as u32] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for t in packed {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        bytes.extend_from_slice(b"the KV state");
        let path = dir.join("slot.bin");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn the_tokens_of_a_state_file_are_read_plain_or_packed_and_anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(state_tokens(&seq_file(dir.path(), &[5, 6, 7])), Some(vec![5, 6, 7]));
        let packed = [-1, 1, 3, 5, 6, 7, 0, 0];
        assert_eq!(state_tokens(&seq_file(dir.path(), &packed)), Some(vec![5, 6, 7]));
        // Media in the prompt, another packing version, a count past the end: refused.
        for bad in [&[-1, 1, 3, 5, 6, 7, 1][..], &[-1, 2, 1, 5, 0], &[-1, 1, 9, 5, 0]] {
            assert_eq!(state_tokens(&seq_file(dir.path(), bad)), None, "{bad:?}");
        }
        let path = seq_file(dir.path(), &[5, 6, 7]);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..14]).unwrap();
        assert_eq!(state_tokens(&path), None, "shorter than it says");
        std::fs::write(&path, b"GGUF and more bytes").unwrap();
        assert_eq!(state_tokens(&path), None, "not a state file");
    }
}
