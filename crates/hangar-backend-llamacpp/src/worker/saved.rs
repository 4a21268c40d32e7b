//! Prompt caches across a swap (`hangar-prompt-cache`). When the generation loop ends (the
//! model unloads, or the replica goes to sleep), the KV state of every slot holding at least
//! [`MIN_TOKENS`] is saved, least recently used first (so the byte bound, which drops the
//! oldest files, drops those first). When a new sequence's prompt shares more tokens with a
//! saved cache than with any slot, the saved state is restored into the least recently used
//! free slot, which then holds those tokens: the prompt reuse of `batch.rs` does the rest,
//! and the answer reports them as cached.
//!
//! A cache is tied to the GGUF (a digest of the whole file) and to every `gguf_*` setting, the
//! devices and the Hangar version; llama.cpp also checks a state's shape when it reads it
//! and refuses one that does not fit (the restore is then logged and the slot starts empty).

use hangar_prompt_cache::{Identity, MIN_TOKENS, Saving, Store};
use llama_cpp_2::token::LlamaToken;

use super::batch::Slot;
use super::{Worker, WorkerSpec};

/// The store of `spec`'s model, when its caches are saved; a store that cannot be opened
/// is logged and the replica serves without one.
pub(super) fn open(spec: &WorkerSpec) -> Option<Store> {
    let (root, model) = spec.saved.as_ref()?;
    let options = format!(
        "hangar {} llama_cpp; devices {:?}; {}",
        env!("CARGO_PKG_VERSION"),
        spec.devices,
        serde_json::to_string(&spec.settings).unwrap_or_default()
    );
    let opened = Identity::of(&spec.path, &options)
        .and_then(|identity| Store::open(&root.dir, model, identity, root.max_bytes));
    match opened {
        Ok(store) => Some(store),
        Err(e) => {
            tracing::warn!(model, error = %e, "saved prompt caches unavailable");
            None
        }
    }
}

fn raw(tokens: &[LlamaToken]) -> Vec<i32> {
    tokens.iter().map(|t| t.0).collect()
}

impl Worker<'_> {
    /// The saved cache to restore for `prompt`, when one shares more than `shared` tokens
    /// (what the best slot shares) and at least [`MIN_TOKENS`].
    pub(super) fn saved_beats(&self, prompt: &[LlamaToken], shared: usize) -> Option<usize> {
        let store = self.store.as_ref()?;
        store.best(&raw(prompt), shared.max(MIN_TOKENS - 1)).map(|(index, _)| index)
    }

    /// Restores saved cache `saved` into slot `index` (emptied first): true when the slot
    /// now holds its tokens. A cache llama.cpp refuses is discarded.
    pub(super) fn restore(&mut self, index: usize, slot: &mut Slot, saved: usize) -> bool {
        let Some(store) = self.store.as_mut() else { return false };
        let started = std::time::Instant::now();
        let payload = match store.payload(saved) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::warn!(error = %e, "a saved prompt cache could not be used");
                return false;
            }
        };
        let expected = store.tokens(saved).to_vec();
        self.forget(index, slot);
        let loaded = self.context.state_seq_load_file(&payload, index as i32, expected.len());
        let cells =
            usize::try_from(self.context.kv_cache_seq_pos_max(index as i32) + 1).unwrap_or(0);
        let tokens = match loaded {
            Ok((tokens, _)) if raw(&tokens) == expected && cells == tokens.len() => tokens,
            other => {
                tracing::warn!(
                    tokens = expected.len(),
                    cells,
                    error = ?other.err(),
                    "llama.cpp refused a saved prompt cache: discarded, the slot starts empty"
                );
                self.forget(index, slot);
                if let Some(store) = self.store.as_mut() {
                    store.discard(saved);
                }
                return false;
            }
        };
        tracing::info!(
            tokens = tokens.len(),
            ms = started.elapsed().as_millis() as u64,
            "saved prompt cache restored"
        );
        slot.cached = tokens;
        true
    }

    /// Saves the state of every slot holding at least [`MIN_TOKENS`], least recently used
    /// first (llama.cpp's sequence state file, written into the store's new file). Called
    /// when the loop ends, with no sequence in flight.
    pub(super) fn save_slots(&mut self, slots: &[Slot]) {
        let Some(mut store) = self.store.take() else { return };
        let started = std::time::Instant::now();
        let mut order: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].cached.len() >= MIN_TOKENS && slots[i].sequence.is_none())
            .collect();
        order.sort_by_key(|&i| slots[i].last_used);
        let (mut saved, mut bytes) = (0usize, 0u64);
        for i in order {
            let (seq, tokens) = (i as i32, &slots[i].cached);
            let cells = usize::try_from(self.context.kv_cache_seq_pos_max(seq) + 1).unwrap_or(0);
            if cells != tokens.len() {
                continue; // the cells and the tokens disagree: nothing trustworthy to save
            }
            let context = &self.context;
            let write =
                |path: &std::path::Path| context.state_seq_save_file(path, seq, tokens).is_ok();
            match store.save_with(&raw(tokens), write) {
                Ok(Saving::Saved(n)) => {
                    saved += 1;
                    bytes += n;
                }
                Ok(Saving::Covered | Saving::TooLarge) => {}
                Err(e) => tracing::warn!(error = %e, "a prompt cache could not be saved"),
            }
        }
        if saved > 0 {
            tracing::info!(
                saved,
                bytes,
                ms = started.elapsed().as_millis() as u64,
                "prompt caches saved"
            );
        }
        self.store = Some(store);
    }
}
