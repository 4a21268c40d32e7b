//! Crash quarantine: a model that fails to load or crashes `quarantine.failures` times within
//! `quarantine.window_seconds` stops being loaded on demand.
//!
//! While quarantined, requests and auto-loads (and lease loads) get `model_quarantined` with
//! `retry_after`; nothing loads it but an explicit load (admin, multi-model or KServe load,
//! reload), which lifts the quarantine and starts counting afresh. The first quarantine
//! lasts `backoff_seconds`; each further one before the model has gone a whole window
//! without failing doubles it, up to `max_backoff_seconds`. A load refused with
//! `slots_pinned` is not the model's failure and does not count.
//!
//! The failures are the control loop's ([`FailureLog`], one per model, changed only by
//! `step`: `control/step/quarantine.rs` holds the rules); it publishes each model's
//! [`FailureView`] to its slot, where the row and admission read them.

use std::collections::VecDeque;
use std::time::Duration;

use hangar_config::QuarantinePolicy;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use hangar_lifecycle::AdmissionError;

/// Failures a row shows at most (more are kept while the policy needs them to count).
pub const RECENT_FAILURES: usize = 8;

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum FailureKind {
    /// A load ran and failed.
    LoadFailed,
    /// A loaded runtime crashed.
    Crashed,
}

/// One failure of a model, for its row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What failed.
    pub kind: FailureKind,
    /// Why (the `last_error` it left).
    pub message: String,
    /// When, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A quarantine in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineInfo {
    /// When it began, Unix milliseconds.
    pub since_unix_ms: u64,
    /// When it ends, Unix milliseconds.
    pub until_unix_ms: u64,
    /// Seconds until it ends (rounded up), when this was read.
    pub retry_after_s: u64,
    /// Failures counted within the window when it began.
    pub failures: u32,
    /// Its place in a run of quarantines without a healthy window between them: 1 for the
    /// first; it lasts `backoff_seconds × 2^(strike − 1)`, at most `max_backoff_seconds`.
    pub strike: u32,
}

/// One model's failures and quarantine.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    /// Newest last: `(when, number, failure)`.
    recent: VecDeque<(Instant, u64, Failure)>,
    /// Failures recorded so far.
    recorded: u64,
    /// Failures numbered below this do not count (an explicit load lifted a quarantine).
    counted_from: u64,
    /// Quarantines since the model last went a whole window without failing.
    strikes: u32,
    /// The latest quarantine: when it ends, and what it was.
    quarantine: Option<(Instant, QuarantineInfo)>,
}

impl FailureLog {
    /// Records a failure at `now` (`wall_ms` on the wall clock); returns the quarantine it
    /// began, if it began one.
    pub(crate) fn record(
        &mut self,
        policy: &QuarantinePolicy,
        kind: FailureKind,
        message: &str,
        now: Instant,
        wall_ms: u64,
    ) -> Option<QuarantineInfo> {
        let before = self.counted(policy, now);
        if before == 0 && self.active(now).is_none() {
            // A whole window without failing: the backoff starts over.
            self.strikes = 0;
        }
        let message = crate::journal::bounded(message);
        let failure = Failure { kind, message, at_unix_ms: wall_ms };
        self.recent.push_back((now, self.recorded, failure));
        self.recorded += 1;
        let keep = RECENT_FAILURES.max(policy.failures.get() as usize);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        let failures = before + 1;
        if failures < policy.failures.get() || self.active(now).is_some() {
            return None;
        }
        let doubling = 1u32.checked_shl(self.strikes).unwrap_or(u32::MAX);
        let length = policy.backoff.saturating_mul(doubling).min(policy.max_backoff);
        self.strikes = self.strikes.saturating_add(1);
        let since_unix_ms = wall_ms;
        let info = QuarantineInfo {
            since_unix_ms,
            until_unix_ms: since_unix_ms + length.as_millis() as u64,
            retry_after_s: length.as_secs().max(1),
            failures,
            strike: self.strikes,
        };
        self.quarantine = Some((now + length, info));
        Some(info)
    }

    /// Failures counted now: within the window and since the last lift.
    fn counted(&self, policy: &QuarantinePolicy, now: Instant) -> u32 {
        let counts = |at: &Instant, n: u64| {
            now.saturating_duration_since(*at) <= policy.window && n >= self.counted_from
        };
        self.recent.iter().filter(|(at, n, _)| counts(at, *n)).count() as u32
    }

    /// The quarantine in effect at `now`, with `retry_after_s` as of then.
    pub(crate) fn active(&self, now: Instant) -> Option<QuarantineInfo> {
        active(self.quarantine.as_ref(), now)
    }

    /// Lifts the quarantine in effect at `now` (an explicit load) and starts counting
    /// afresh; whether one was in effect. A quarantine that already ended changes nothing:
    /// the failures before it still count, and the next quarantine is longer.
    pub(crate) fn lift(&mut self, now: Instant) -> bool {
        if self.active(now).is_none() {
            return false;
        }
        self.quarantine = None;
        self.strikes = 0;
        self.counted_from = self.recorded;
        true
    }

    /// The newest failure's message.
    pub(crate) fn last_message(&self) -> Option<&str> {
        self.recent.back().map(|(_, _, f)| f.message.as_str())
    }

    /// The recent failures, oldest first, at most [`RECENT_FAILURES`].
    pub(crate) fn recent(&self) -> Vec<Failure> {
        let skip = self.recent.len().saturating_sub(RECENT_FAILURES);
        self.recent.iter().skip(skip).map(|(_, _, f)| f.clone()).collect()
    }

    /// What readers outside the loop see of this log.
    pub(crate) fn view(&self) -> FailureView {
        FailureView {
            recent: self.recent(),
            quarantine: self.quarantine,
            last_message: self.last_message().map(str::to_owned),
        }
    }
}

/// A model's failures as the control loop last published them to its slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FailureView {
    recent: Vec<Failure>,
    quarantine: Option<(Instant, QuarantineInfo)>,
    last_message: Option<String>,
}

impl FailureView {
    /// The recent failures, oldest first, at most [`RECENT_FAILURES`].
    pub(crate) fn recent(&self) -> Vec<Failure> {
        self.recent.clone()
    }

    /// The quarantine in effect now, with `retry_after_s` as of now.
    pub(crate) fn active(&self) -> Option<QuarantineInfo> {
        active(self.quarantine.as_ref(), Instant::now())
    }
}

/// The quarantine `latest` (when it ends, and what it was), if in effect at `now`.
fn active(latest: Option<&(Instant, QuarantineInfo)>, now: Instant) -> Option<QuarantineInfo> {
    let (until, info) = latest?;
    let left = until.checked_duration_since(now).filter(|d| !d.is_zero())?;
    Some(QuarantineInfo { retry_after_s: ceil_secs(left), ..*info })
}

/// Why the control loop refuses a load: a load on demand while the model is quarantined
/// (the quarantine, and the newest failure's message), or any load of a model that left
/// the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Quarantined: a load on demand waits for the quarantine to end.
    Quarantined { quarantine: QuarantineInfo, last_error: String },
    /// The model left the config (a reload removed or replaced it).
    Removed,
    /// Its last load failed after evicting everything, and nothing was freed since
    /// (`control/step/exhaust.rs`): a load on demand is refused at once.
    Exhausted { last_error: String },
}

impl Refused {
    /// The error for a load of `model` (on a GPU when `gpu`).
    pub(crate) fn into_error(self, model: &str, gpu: bool) -> ManagerError {
        match self {
            Self::Exhausted { last_error } => {
                ManagerError::LoadExhausted { model: model.to_owned(), gpu, last_error }
            }
            Self::Quarantined { quarantine, last_error } => {
                ManagerError::Quarantined { model: model.to_owned(), quarantine, last_error }
            }
            Self::Removed => AdmissionError::UnknownModel { model: model.to_owned() }.into(),
        }
    }
}

/// The refusal of a quarantined model, if it is quarantined (as last published).
pub(crate) fn quarantined(entry: &ModelEntry, slot: &Slot) -> Option<ManagerError> {
    let quarantine = slot.failures.active()?;
    let last_error = slot.failures.last_message.clone().unwrap_or_default();
    let name = entry.config.name.as_str();
    Some(ManagerError::Quarantined { model: name.to_owned(), quarantine, last_error })
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn policy(failures: u32, window: u64, backoff: u64, max: u64) -> QuarantinePolicy {
        QuarantinePolicy {
            failures: NonZeroU32::new(failures).unwrap(),
            window: Duration::from_secs(window),
            backoff: Duration::from_secs(backoff),
            max_backoff: Duration::from_secs(max),
        }
    }

    #[test]
    fn quarantines_at_the_threshold_and_doubles_while_failing() {
        let p = policy(3, 60, 10, 25);
        let mut log = FailureLog::default();
        let mut now = Instant::now();
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "a", now, 0), None);
        assert_eq!(log.record(&p, FailureKind::Crashed, "b", now, 0), None);
        let first = log.record(&p, FailureKind::LoadFailed, "c", now, 0).expect("third failure");
        assert_eq!((first.failures, first.strike, first.retry_after_s), (3, 1, 10));
        assert_eq!(log.active(now).map(|q| q.retry_after_s), Some(10));
        now += Duration::from_millis(9_500);
        assert_eq!(log.active(now).map(|q| q.retry_after_s), Some(1));
        now += Duration::from_millis(600);
        assert_eq!(log.active(now), None, "over after its backoff");
        // Still within the window: the next failure quarantines again, twice as long.
        let second = log.record(&p, FailureKind::Crashed, "d", now, 0).expect("within the window");
        assert_eq!((second.failures, second.strike, second.retry_after_s), (4, 2, 20));
        now += Duration::from_secs(21);
        let third = log.record(&p, FailureKind::Crashed, "e", now, 0).unwrap();
        assert_eq!((third.strike, third.retry_after_s), (3, 25), "capped at max_backoff");
        let kinds: Vec<_> = log.recent().iter().map(|f| f.message.clone()).collect();
        assert_eq!(kinds, ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn a_healthy_window_and_a_lift_start_over() {
        let p = policy(2, 60, 10, 3600);
        let mut log = FailureLog::default();
        let mut now = Instant::now();
        log.record(&p, FailureKind::Crashed, "a", now, 0);
        assert!(log.record(&p, FailureKind::Crashed, "b", now, 0).is_some());
        now += Duration::from_secs(11);
        assert_eq!(log.record(&p, FailureKind::Crashed, "c", now, 0).unwrap().strike, 2);
        // A whole window without failing: one failure no longer quarantines, and the next
        // quarantine is a first one again.
        now += Duration::from_secs(61);
        assert_eq!(log.record(&p, FailureKind::Crashed, "d", now, 0), None);
        let again = log.record(&p, FailureKind::Crashed, "e", now, 0).unwrap();
        assert_eq!((again.strike, again.retry_after_s, again.failures), (1, 10, 2));
        // A lift ends it at once and forgets the failures before it for counting.
        assert!(log.lift(now));
        assert_eq!(log.active(now), None);
        assert!(!log.lift(now), "nothing left to lift");
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "f", now, 0), None);
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "g", now, 0).unwrap().strike, 1);
        assert_eq!(log.recent().len(), 7, "the row still shows the failures before the lift");
    }

    #[test]
    fn the_row_keeps_the_newest_failures() {
        let p = policy(100, 60, 10, 3600);
        let mut log = FailureLog::default();
        let now = Instant::now();
        for i in 0..20 {
            log.record(&p, FailureKind::LoadFailed, &i.to_string(), now, 0);
        }
        let shown: Vec<_> = log.recent().into_iter().map(|f| f.message).collect();
        assert_eq!(shown, (12..20).map(|i| i.to_string()).collect::<Vec<_>>());
    }
}
