//! Continuous batching: the generation loop of a replica. The context holds `n_seq_max`
//! sequence slots in one unified KV cache with room for every slot's full context (a slot's
//! sequence never holds more than one sequence's context, so no step runs out of cells). Each step decodes one `llama_batch` holding the next token of every
//! decoding sequence and prompt chunks of new ones (within `n_batch`), then samples each
//! sequence from its own logits. New requests join between steps while a slot is free;
//! finished, failed or cancelled ones leave at once, and their slot takes the next request.
//!
//! Prompt reuse: a slot keeps the tokens its cells hold after its sequence leaves. A new
//! sequence takes the free slot whose tokens share the longest prefix with its prompt, removes
//! the cells after that prefix and decodes only the rest — the next turn of a chat decodes
//! only the new turn, as `llama-server`'s prompt cache does. What the slots hold is saved when
//! the loop ends and restored across an unload or a sleep (`saved.rs`).

use std::collections::VecDeque;

use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc;

use super::generate::{Phase, Sequence};
use super::{Command, Worker, failed, unsupported};

/// One sequence slot of the context.
#[derive(Default)]
pub(super) struct Slot {
    /// The tokens whose KV cells the slot holds, in position order.
    pub(super) cached: Vec<LlamaToken>,
    /// The generation using the slot.
    pub(super) sequence: Option<Sequence>,
    /// When a sequence last took the slot (a counter of seatings).
    pub(super) last_used: u64,
}

/// What a slot holds, for tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotState {
    /// Whether a generation is using it.
    pub busy: bool,
    /// Tokens in its KV cells (kept for prompt reuse once the generation left).
    pub cached_tokens: usize,
    /// Cells llama.cpp reports for the slot's sequence: its highest position plus one.
    pub kv_cells: usize,
}

/// Where a token of the batch came from.
struct Entry {
    slot: usize,
    /// The token's index in the batch, when its logits are wanted.
    logits: Option<i32>,
    /// Prompt tokens it fed (0 for a generated token).
    fed: usize,
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Worker<'_> {
    /// Serves generations until the command channel closes and every sequence has left, or
    /// until a sleep is asked with nothing in flight.
    pub(super) fn serve(&mut self, commands: &mut mpsc::Receiver<Command>) {
        let mut slots: Vec<Slot> = (0..self.n_seq).map(|_| Slot::default()).collect();
        let mut batch = LlamaBatch::new(self.n_batch(), 1);
        // Generations received while every slot is taken, in arrival order.
        let mut waiting = VecDeque::new();
        let mut turn = 0usize;
        loop {
            if waiting.is_empty() && slots.iter().all(|s| s.sequence.is_none()) {
                match commands.blocking_recv() {
                    Some(command) => self.receive(command, &mut waiting, &slots),
                    None => break,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.receive(command, &mut waiting, &slots);
            }
            let idle = waiting.is_empty() && slots.iter().all(|s| s.sequence.is_none());
            if self.leaves_for_sleep(idle) {
                break;
            }
            while slots.iter().any(|s| s.sequence.is_none()) {
                let Some(sequence) = waiting.pop_front() else { break };
                self.seat(sequence, &mut slots);
            }
            turn = turn.wrapping_add(1);
            let entries = self.fill(&mut batch, &mut slots, turn);
            if entries.is_empty() {
                if slots.iter().any(|s| s.sequence.is_some()) {
                    // Every sequence waits for its client to read: give them a moment.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                continue;
            }
            if let Err(e) = self.context.decode(&mut batch) {
                let error = failed(format!("llama_decode: {e}"));
                for entry in &entries {
                    self.forget(entry.slot, &mut slots[entry.slot]);
                    if let Some(sequence) = slots[entry.slot].sequence.take() {
                        sequence.fail(error.clone());
                    }
                }
                continue;
            }
            self.advance(&entries, &mut slots);
        }
        self.save_slots(&slots);
    }

    /// Takes a command: a generation is checked and waits for a slot (or gets its error at
    /// once); the rest are answered at once.
    fn receive(&mut self, command: Command, waiting: &mut VecDeque<Sequence>, slots: &[Slot]) {
        match command {
            Command::Generate { request, prepared, events, reply } => {
                match self.sequence(&request, prepared, events, reply) {
                    Ok(sequence) => waiting.push_back(sequence),
                    Err((reply, e)) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Embed { reply, .. } => {
                let _ = reply.send(Err(unsupported("embed", self.spec.model_type)));
            }
            Command::Rerank { reply, .. } => {
                let _ = reply.send(Err(unsupported("rerank", self.spec.model_type)));
            }
            Command::Slots { reply } => {
                let _ = reply.send(self.slot_states(slots));
            }
            Command::Sleep { reply } => self.ask_sleep(reply),
            Command::Wake { reply } => {
                let _ = reply.send(Ok(()));
            }
        }
    }

    /// What each slot holds.
    pub(super) fn slot_states(&self, slots: &[Slot]) -> Vec<SlotState> {
        let cells = |i: usize| usize::try_from(self.context.kv_cache_seq_pos_max(i as i32) + 1);
        (0..slots.len())
            .map(|i| SlotState {
                busy: slots[i].sequence.is_some(),
                cached_tokens: slots[i].cached.len(),
                kv_cells: cells(i).unwrap_or(0),
            })
            .collect()
    }

    /// Seats `sequence` in a free slot, dropping the slot's cells after the prefix they share
    /// with its prompt: the slot sharing the longest prefix when that is at least a tenth of
    /// the prompt (`llama-server`'s similarity rule), else the least recently used one, so
    /// that an unrelated prompt does not overwrite a conversation's cache. A saved prompt
    /// cache sharing more than any slot is restored into the least recently used one first
    /// (`saved.rs`).
    fn seat(&mut self, mut sequence: Sequence, slots: &mut [Slot]) {
        let free = || (0..slots.len()).filter(|&i| slots[i].sequence.is_none());
        let shared = |i: usize| common_prefix(&slots[i].cached, &sequence.prompt);
        let best = free().map(shared).max().unwrap_or(0);
        let similar = free()
            .map(|i| (shared(i), i))
            .filter(|&(n, _)| n * 10 >= sequence.prompt.len() && n > 1)
            .max();
        let lru = free().min_by_key(|&i| slots[i].last_used);
        let restored = match (self.saved_beats(&sequence.prompt, best), lru) {
            (Some(saved), Some(i)) => self.restore(i, &mut slots[i], saved).then_some(i),
            _ => None,
        };
        let Some(index) = restored.or(similar.map(|(_, i)| i)).or(lru) else {
            sequence.fail(failed("no free sequence slot"));
            return;
        };
        self.seatings += 1;
        let slot = &mut slots[index];
        slot.last_used = self.seatings;
        // At least the prompt's last token is decoded again: its logits start the answer.
        let mut keep = common_prefix(&slot.cached, &sequence.prompt).min(sequence.prompt.len() - 1);
        let trimmed = u32::try_from(keep)
            .ok()
            .is_some_and(|p0| self.context.kv_cache_seq_rm(index as i32, Some(p0), None).is_ok());
        if !trimmed {
            // Models whose memory cannot drop a tail (recurrent) start over.
            self.forget(index, slot);
            keep = 0;
        }
        slot.cached.truncate(keep);
        sequence.fed = keep;
        sequence.reused = keep;
        sequence.n_past = keep;
        slot.sequence = Some(sequence);
    }

    /// Drops every cell of slot `index`.
    pub(super) fn forget(&mut self, index: usize, slot: &mut Slot) {
        slot.cached.clear();
        let _ = self.context.clear_kv_cache_seq(u32::try_from(index).ok(), None, None);
    }

    /// Fills `batch` for one step: retires the sequences that left, then adds the next token
    /// of every decoding sequence and prompt chunks of new ones, within `n_batch`, starting at
    /// a slot that turns with each step so no sequence waits behind the others every time.
    fn fill(&mut self, batch: &mut LlamaBatch, slots: &mut [Slot], turn: usize) -> Vec<Entry> {
        batch.clear();
        let mut entries = Vec::new();
        let mut room = self.n_batch();
        let n = slots.len();
        let order: Vec<usize> = (0..n).map(|k| (turn + k) % n).collect();
        let mut prompts = Vec::new();
        for &index in &order {
            let Some(sequence) = slots[index].sequence.as_mut() else { continue };
            match sequence.phase() {
                Phase::Gone => {
                    if let Some(sequence) = slots[index].sequence.take() {
                        sequence.retire();
                    }
                }
                Phase::Blocked => {}
                Phase::Prompt => prompts.push(index),
                Phase::Decode => {
                    let (Some(token), true) = (sequence.next, room > 0) else { continue };
                    let logits = Some(batch.n_tokens());
                    if batch.add(token, sequence.n_past as i32, &[index as i32], true).is_ok() {
                        room -= 1;
                        entries.push(Entry { slot: index, logits, fed: 0 });
                    }
                }
            }
        }
        for index in prompts {
            let Some(sequence) = slots[index].sequence.as_ref() else { continue };
            let take = (sequence.prompt.len() - sequence.fed).min(room);
            if take == 0 {
                break;
            }
            let completes = sequence.fed + take == sequence.prompt.len();
            let mut logits = None;
            let mut fed = 0;
            for (k, &token) in sequence.prompt[sequence.fed..sequence.fed + take].iter().enumerate()
            {
                let last = completes && k + 1 == take;
                let at = batch.n_tokens();
                if batch.add(token, (sequence.n_past + k) as i32, &[index as i32], last).is_err() {
                    break;
                }
                fed += 1;
                logits = last.then_some(at);
            }
            if fed == 0 {
                break;
            }
            room -= fed;
            entries.push(Entry { slot: index, logits, fed });
        }
        entries
    }

    /// After a decode: records what each sequence's cells now hold and samples those with
    /// logits; a sequence that ends or fails leaves.
    fn advance(&mut self, entries: &[Entry], slots: &mut [Slot]) {
        let n_ctx = self.n_ctx();
        for entry in entries {
            let slot = &mut slots[entry.slot];
            let Some(sequence) = slot.sequence.as_mut() else { continue };
            if entry.fed > 0 {
                slot.cached
                    .extend_from_slice(&sequence.prompt[sequence.fed..sequence.fed + entry.fed]);
                sequence.fed += entry.fed;
                sequence.n_past += entry.fed;
            } else if let Some(token) = sequence.next.take() {
                slot.cached.push(token);
                sequence.n_past += 1;
            }
            let Some(i) = entry.logits else { continue };
            if let Err(e) = sequence.step(&self.context, i, self.model, self.utf8, n_ctx)
                && let Some(sequence) = slot.sequence.take()
            {
                sequence.fail(e);
            }
        }
    }
}
