//! The event journal: every operator-visible change (state transitions, load progress,
//! evictions with their reason, crashes), numbered, the last [`EVENT_CAPACITY`] kept so a
//! follower that reconnects with the last id it saw misses nothing.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use hangar_config::ModelName;
use hangar_lifecycle::{LifecycleEvent, ModelState};
use serde::Serialize;
use tokio::sync::broadcast;

/// Events the journal keeps for followers that resume.
pub const EVENT_CAPACITY: usize = 1_024;

/// Longest text an event (and a model's `last_error`, a failure's message) keeps, in bytes:
/// an engine can print megabytes into an error, and the journal keeps
/// [`EVENT_CAPACITY`] events. Longer text is cut on a character boundary and ends with a
/// marker saying how much was cut.
pub const MAX_EVENT_TEXT_BYTES: usize = 4_096;

/// Room kept for the marker (`" … [<n> bytes cut]"`) within [`MAX_EVENT_TEXT_BYTES`].
const MARKER_ROOM: usize = 48;

/// Load progress is journaled in steps of this much (and at 100 %), not at every report.
const PROGRESS_STEP: f32 = 0.05;

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ManagerEvent {
    /// Position in the journal: 1 for the first event of this process, then +1 each (the
    /// server-sent event's `id`, for `Last-Event-ID`).
    pub id: u64,
    /// When it happened, Unix milliseconds.
    pub unix_ms: u64,
    /// The model it concerns.
    pub model: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened to a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A lifecycle transition (a crash is one: `loaded` → `failed`, cause `crashed`).
    State {
        /// State before.
        from: ModelState,
        /// State after.
        to: ModelState,
        /// What moved it.
        cause: LifecycleEvent,
        /// `last_error` when the model failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A loading model's progress, from 0 to 1, over all its replicas.
    LoadProgress {
        /// Share loaded.
        progress: f32,
    },
    /// The model is being unloaded to make room (its `state` events follow).
    Evicted {
        /// `slot_limit`, `exclusive_device`, `vram_budget` or `load_failure_retry`.
        reason: String,
        /// The model whose load needed the room.
        for_model: String,
    },
    /// The model was paused (or its pause changed mode).
    Paused {
        /// What the pause did to admitted requests.
        mode: crate::pause::PauseMode,
        /// Who paused it.
        cause: crate::pause::PauseCause,
    },
    /// The model continued after a pause.
    Resumed,
    /// The model's runtimes went to sleep (it stays loaded).
    Slept {
        /// How deeply.
        level: hangar_backend::SleepLevel,
        /// The model whose load it made room for; `None` when an operator or the idle
        /// timer put it to sleep.
        for_model: Option<String>,
    },
    /// They woke and passed the wake check.
    Woke {
        /// How long waking and the check took, in milliseconds.
        wake_ms: u64,
    },
    /// A lease was taken, renewed, released, expired or revoked.
    Lease {
        /// What happened.
        change: crate::lease::LeaseChange,
        /// The lease.
        id: String,
        /// Its holder.
        owner: String,
    },
    /// The model is being unloaded after `idle_unload_seconds` without work (its `state`
    /// events follow).
    IdleUnload {
        /// How long it had been idle.
        idle_seconds: u64,
    },
    /// New weights replaced the loaded ones.
    WeightsUpdated {
        /// The file or directory they came from.
        model_path: String,
        /// The new `weight_version`, if the update set one.
        #[serde(skip_serializing_if = "Option::is_none")]
        weight_version: Option<String>,
    },
    /// The model failed too often and is refused until `until_unix_ms`.
    Quarantined {
        /// The quarantine.
        #[serde(flatten)]
        quarantine: crate::QuarantineInfo,
    },
    /// An explicit load lifted the model's quarantine.
    QuarantineLifted,
    /// A config reload changed the model's definition: added, removed, changed or pending.
    Definition {
        /// What changed.
        change: DefinitionChange,
    },
}

/// What a config reload did to a model's definition (the journal's `definition` events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionChange {
    /// The model joined.
    Added,
    /// The model left: unloaded gracefully, it answers to no name.
    Removed,
    /// A changed definition took effect (nothing of the model was running).
    Changed,
    /// A changed definition waits for the model's next load.
    Pending,
}

/// What a follower gets: the journaled events after the id it gave, whether some were
/// already dropped, and the live feed of every later one.
pub struct Follow {
    /// Events after the given id, oldest first.
    pub backlog: Vec<ManagerEvent>,
    /// Events between the given id and the backlog are gone (more than
    /// [`EVENT_CAPACITY`] happened since): re-read the models.
    pub gap: bool,
    /// The id of the newest event journaled when the follow began: the live feed starts
    /// after it.
    pub last_id: u64,
    /// Every later event.
    pub live: broadcast::Receiver<ManagerEvent>,
}

pub(crate) struct Journal {
    /// When this journal began, Unix milliseconds: ids of another process's journal (a
    /// follower from before a restart) carry another epoch.
    pub(crate) epoch: u64,
    state: Mutex<State>,
    live: broadcast::Sender<ManagerEvent>,
}

struct State {
    next_id: u64,
    events: VecDeque<ManagerEvent>,
}

impl Journal {
    pub(crate) fn new() -> Self {
        let state = State { next_id: 1, events: VecDeque::with_capacity(EVENT_CAPACITY) };
        Self {
            epoch: unix_ms(SystemTime::now()),
            state: Mutex::new(state),
            live: broadcast::Sender::new(256),
        }
    }

    /// Journals `kind` for `model` (its text [bounded](bound)) and sends it to followers.
    pub(crate) fn record(&self, model: &ModelName, mut kind: EventKind) {
        match &mut kind {
            EventKind::State { error: Some(text), .. }
            | EventKind::Lease { owner: text, .. }
            | EventKind::WeightsUpdated { model_path: text, .. } => bound(text),
            EventKind::Evicted { reason, for_model } => {
                bound(reason);
                bound(for_model);
            }
            _ => {}
        }
        let unix_ms = unix_ms(SystemTime::now());
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let event = ManagerEvent { id: state.next_id, unix_ms, model: model.to_string(), kind };
        state.next_id += 1;
        if state.events.len() == EVENT_CAPACITY {
            state.events.pop_front();
        }
        state.events.push_back(event.clone());
        // Sent under the lock, so the live feed's order is the journal's.
        let _ = self.live.send(event);
    }

    /// Journals load progress when it moved by [`PROGRESS_STEP`] since `last` (or
    /// reached 1); returns the progress now journaled last.
    pub(crate) fn progress(
        &self,
        model: &ModelName,
        last: Option<f32>,
        progress: f32,
    ) -> Option<f32> {
        let moved =
            last.is_none_or(|l| progress - l >= PROGRESS_STEP || (progress >= 1.0 && l < 1.0));
        if !moved {
            return last;
        }
        self.record(model, EventKind::LoadProgress { progress });
        Some(progress)
    }

    /// The events after `after` — `(epoch, id)` of the last event a follower saw — and the
    /// live feed, taken together: nothing is missed or repeated between the two. `None`:
    /// only what happens from now on. Another epoch: every kept event, and a gap.
    pub(crate) fn follow(&self, after: Option<(u64, u64)>) -> Follow {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let live = self.live.subscribe();
        let last_id = state.next_id - 1;
        let Some((epoch, after)) = after else {
            return Follow { backlog: Vec::new(), gap: false, last_id, live };
        };
        if epoch != self.epoch {
            let backlog = state.events.iter().cloned().collect();
            return Follow { backlog, gap: true, last_id, live };
        }
        let backlog: Vec<ManagerEvent> =
            state.events.iter().filter(|e| e.id > after).cloned().collect();
        let first_kept = state.events.front().map_or(state.next_id, |e| e.id);
        // An id from the future (another process's journal) is a gap too. Any `after` is
        // possible here (a client's `Last-Event-ID`): no arithmetic on it may overflow.
        let gap = after >= state.next_id || after.saturating_add(1) < first_kept;
        Follow { backlog, gap, last_id, live }
    }
}

/// Where text longer than [`MAX_EVENT_TEXT_BYTES`] is cut: a character boundary that leaves
/// room for the marker. `None` for text that fits.
fn cut_at(text: &str) -> Option<usize> {
    if text.len() <= MAX_EVENT_TEXT_BYTES {
        return None;
    }
    let mut keep = MAX_EVENT_TEXT_BYTES - MARKER_ROOM;
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    Some(keep)
}

fn marker(cut: usize) -> String {
    format!(" … [{cut} bytes cut]")
}

/// Cuts `text` to at most [`MAX_EVENT_TEXT_BYTES`] on a character boundary, ending it with
/// a marker saying how many bytes were cut; shorter text stays as it is.
pub(crate) fn bound(text: &mut String) {
    if let Some(keep) = cut_at(text) {
        let cut = text.len() - keep;
        text.truncate(keep);
        text.push_str(&marker(cut));
    }
}

/// `text`, [bounded](bound), copying only what is kept.
pub(crate) fn bounded(text: &str) -> String {
    match cut_at(text) {
        Some(keep) => text[..keep].to_owned() + &marker(text.len() - keep),
        None => text.to_owned(),
    }
}

/// Unix milliseconds of `at` (0 before the epoch).
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ModelName {
        ModelName::new("m").unwrap()
    }

    fn progress(p: f32) -> EventKind {
        EventKind::LoadProgress { progress: p }
    }

    #[tokio::test]
    async fn followers_resume_after_the_last_id_they_saw() {
        let journal = Journal::new();
        for p in [0.1, 0.2, 0.3] {
            journal.record(&name(), progress(p));
        }
        let epoch = journal.epoch;
        let Follow { backlog, gap, last_id, mut live } = journal.follow(Some((epoch, 1)));
        assert_eq!(last_id, 3);
        assert_eq!(backlog.iter().map(|e| e.id).collect::<Vec<_>>(), [2, 3]);
        assert!(!gap);
        journal.record(&name(), progress(0.4));
        assert_eq!(live.recv().await.unwrap().id, 4);
        // Without an id: only what comes next.
        let fresh = journal.follow(None);
        assert!(fresh.backlog.is_empty() && !fresh.gap);
        // Up to date: nothing to replay, no gap.
        let current = journal.follow(Some((epoch, 4)));
        assert!(current.backlog.is_empty() && !current.gap);
        // Another process's id: everything kept, and the follower is told to re-read.
        let restarted = journal.follow(Some((epoch + 1, 2)));
        assert!(restarted.gap);
        assert_eq!(restarted.backlog.len(), 4);
    }

    #[test]
    fn a_follower_too_far_behind_or_from_elsewhere_is_told_of_the_gap() {
        let journal = Journal::new();
        for i in 0..EVENT_CAPACITY + 10 {
            journal.record(&name(), progress(i as f32));
        }
        let epoch = journal.epoch;
        let behind = journal.follow(Some((epoch, 5)));
        assert!(behind.gap);
        assert_eq!(behind.backlog.len(), EVENT_CAPACITY);
        assert_eq!(behind.backlog[0].id, 11);
        let just_kept = journal.follow(Some((epoch, 10)));
        assert!(!just_kept.gap, "event 11 is the oldest kept: nothing missed");
        assert!(journal.follow(Some((epoch, 1_000_000))).gap);
        let largest = journal.follow(Some((epoch, u64::MAX)));
        assert!(largest.gap && largest.backlog.is_empty());
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_with_a_marker() {
        let check = |text: String| {
            let mut bounded = text.clone();
            bound(&mut bounded);
            assert_eq!(bounded, super::bounded(&text));
            if text.len() <= MAX_EVENT_TEXT_BYTES {
                assert_eq!(bounded, text);
                return;
            }
            assert!(bounded.len() <= MAX_EVENT_TEXT_BYTES, "{}", bounded.len());
            let kept = bounded.split(" … [").next().unwrap();
            assert!(text.starts_with(kept) && kept.len() + MARKER_ROOM + 3 >= MAX_EVENT_TEXT_BYTES);
            let cut = text.len() - kept.len();
            assert!(bounded.ends_with(&format!(" … [{cut} bytes cut]")), "{bounded:?}");
        };
        check("short".to_owned());
        check("x".repeat(MAX_EVENT_TEXT_BYTES));
        check("x".repeat(MAX_EVENT_TEXT_BYTES + 1));
        check("x".repeat(8 << 20));
        // Multi-byte characters across the cut, at every offset.
        for pad in 0..4 {
            check(format!("{}{}", "a".repeat(pad), "é€😀".repeat(MAX_EVENT_TEXT_BYTES)));
        }
    }

    #[test]
    fn journaled_errors_and_owners_are_bounded() {
        let journal = Journal::new();
        let huge = "engine says: ".to_owned() + &"0123456789".repeat(1 << 20);
        journal.record(
            &name(),
            EventKind::State {
                from: ModelState::Loading,
                to: ModelState::Failed,
                cause: LifecycleEvent::LoadFailed,
                error: Some(huge.clone()),
            },
        );
        let owner = crate::lease::LeaseChange::Acquired;
        journal.record(&name(), EventKind::Lease { change: owner, id: "l".into(), owner: huge });
        let events = journal.follow(Some((journal.epoch, 0))).backlog;
        let texts: Vec<&String> = events
            .iter()
            .map(|e| match &e.kind {
                EventKind::State { error: Some(text), .. }
                | EventKind::Lease { owner: text, .. } => text,
                other => panic!("{other:?}"),
            })
            .collect();
        for text in texts {
            assert!(text.len() <= MAX_EVENT_TEXT_BYTES && text.starts_with("engine says: 0123"));
            assert!(text.ends_with("bytes cut]"), "{}", &text[text.len() - 40..]);
        }
    }

    #[test]
    fn load_progress_is_journaled_in_steps() {
        let journal = Journal::new();
        let mut last = None;
        for p in [0.0, 0.01, 0.02, 0.06, 0.07, 0.5, 0.98, 1.0] {
            last = journal.progress(&name(), last, p);
        }
        let follow = journal.follow(Some((journal.epoch, 0)));
        let journaled: Vec<f32> = follow
            .backlog
            .iter()
            .map(|e| match e.kind {
                EventKind::LoadProgress { progress } => progress,
                _ => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(journaled, [0.0, 0.06, 0.5, 0.98, 1.0]);
    }
}
