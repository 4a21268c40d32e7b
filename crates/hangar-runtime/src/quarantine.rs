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
//! The failures are kept per model ([`FailureLog`], in its slot) and shown in the row with
//! the quarantine in effect.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use hangar_config::QuarantinePolicy;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::journal::{EventKind, unix_ms};
use crate::manager::Manager;

/// Failures a row shows at most (more are kept while the policy needs them to count).
pub const RECENT_FAILURES: usize = 8;

/// What failed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum FailureKind {
    /// A load ran and failed.
    LoadFailed,
    /// A loaded runtime crashed.
    Crashed,
}

/// One failure of a model, for its row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Failure {
    /// What failed.
    pub kind: FailureKind,
    /// Why (the `last_error` it left).
    pub message: String,
    /// When, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A quarantine in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// Records a failure; returns the quarantine it began, if it began one.
    pub(crate) fn record(
        &mut self,
        policy: &QuarantinePolicy,
        kind: FailureKind,
        message: &str,
    ) -> Option<QuarantineInfo> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let before = self.counted(policy, now);
        if before == 0 && self.active().is_none() {
            // A whole window without failing: the backoff starts over.
            self.strikes = 0;
        }
        let message = crate::journal::bounded(message);
        let failure = Failure { kind, message, at_unix_ms: unix_ms(wall) };
        self.recent.push_back((now, self.recorded, failure));
        self.recorded += 1;
        let keep = RECENT_FAILURES.max(policy.failures.get() as usize);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        let failures = before + 1;
        if failures < policy.failures.get() || self.active().is_some() {
            return None;
        }
        let doubling = 1u32.checked_shl(self.strikes).unwrap_or(u32::MAX);
        let length = policy.backoff.saturating_mul(doubling).min(policy.max_backoff);
        self.strikes = self.strikes.saturating_add(1);
        let since_unix_ms = unix_ms(wall);
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

    /// The quarantine in effect now, with `retry_after_s` as of now.
    pub(crate) fn active(&self) -> Option<QuarantineInfo> {
        let (until, info) = self.quarantine.as_ref()?;
        let left = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        Some(QuarantineInfo { retry_after_s: ceil_secs(left), ..*info })
    }

    /// Lifts the quarantine in effect (an explicit load) and starts counting afresh; whether
    /// one was in effect. A quarantine that already ended changes nothing: the failures
    /// before it still count, and the next quarantine is longer.
    pub(crate) fn lift(&mut self) -> bool {
        if self.active().is_none() {
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
}

impl Manager {
    /// Records a failed load or a crash of `entry`, quarantining it when the policy says.
    pub(crate) fn record_failure(
        &self,
        entry: &ModelEntry,
        slot: &mut Slot,
        kind: FailureKind,
        message: &str,
    ) {
        let Some(quarantine) = slot.failures.record(&self.inner.quarantine, kind, message) else {
            return;
        };
        let name = &entry.config.name;
        tracing::warn!(model = %name, failures = quarantine.failures, retry_after_s = quarantine.retry_after_s, "model quarantined");
        self.inner.events.journal.record(name, EventKind::Quarantined { quarantine });
    }

    /// Refuses a load on demand while `entry` is quarantined.
    ///
    /// # Errors
    /// [`ManagerError::Quarantined`].
    pub(crate) fn check_quarantine(
        &self,
        entry: &ModelEntry,
        slot: &Slot,
    ) -> Result<(), ManagerError> {
        match quarantined(entry, slot) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Lifts `entry`'s quarantine (an explicit load).
    pub(crate) fn lift_quarantine(&self, entry: &ModelEntry, slot: &mut Slot) {
        if slot.failures.lift() {
            tracing::info!(model = %entry.config.name, "quarantine lifted by an explicit load");
            self.inner.events.journal.record(&entry.config.name, EventKind::QuarantineLifted);
        }
    }
}

/// The refusal of a quarantined model, if it is quarantined.
pub(crate) fn quarantined(entry: &ModelEntry, slot: &Slot) -> Option<ManagerError> {
    let quarantine = slot.failures.active()?;
    let last_error = slot.failures.last_message().unwrap_or_default().to_owned();
    Some(ManagerError::Quarantined { model: entry.config.name.to_string(), quarantine, last_error })
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

    #[tokio::test(start_paused = true)]
    async fn quarantines_at_the_threshold_and_doubles_while_failing() {
        let p = policy(3, 60, 10, 25);
        let mut log = FailureLog::default();
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "a"), None);
        assert_eq!(log.record(&p, FailureKind::Crashed, "b"), None);
        let first = log.record(&p, FailureKind::LoadFailed, "c").expect("third failure");
        assert_eq!((first.failures, first.strike, first.retry_after_s), (3, 1, 10));
        assert_eq!(log.active().map(|q| q.retry_after_s), Some(10));
        tokio::time::advance(Duration::from_millis(9_500)).await;
        assert_eq!(log.active().map(|q| q.retry_after_s), Some(1));
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(log.active(), None, "over after its backoff");
        // Still within the window: the next failure quarantines again, twice as long.
        let second = log.record(&p, FailureKind::Crashed, "d").expect("within the window");
        assert_eq!((second.failures, second.strike, second.retry_after_s), (4, 2, 20));
        tokio::time::advance(Duration::from_secs(21)).await;
        let third = log.record(&p, FailureKind::Crashed, "e").unwrap();
        assert_eq!((third.strike, third.retry_after_s), (3, 25), "capped at max_backoff");
        let kinds: Vec<_> = log.recent().iter().map(|f| f.message.clone()).collect();
        assert_eq!(kinds, ["a", "b", "c", "d", "e"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_window_and_a_lift_start_over() {
        let p = policy(2, 60, 10, 3600);
        let mut log = FailureLog::default();
        log.record(&p, FailureKind::Crashed, "a");
        assert!(log.record(&p, FailureKind::Crashed, "b").is_some());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(log.record(&p, FailureKind::Crashed, "c").unwrap().strike, 2);
        // A whole window without failing: one failure no longer quarantines, and the next
        // quarantine is a first one again.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(log.record(&p, FailureKind::Crashed, "d"), None);
        let again = log.record(&p, FailureKind::Crashed, "e").unwrap();
        assert_eq!((again.strike, again.retry_after_s, again.failures), (1, 10, 2));
        // A lift ends it at once and forgets the failures before it for counting.
        assert!(log.lift());
        assert_eq!(log.active(), None);
        assert!(!log.lift(), "nothing left to lift");
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "f"), None);
        assert_eq!(log.record(&p, FailureKind::LoadFailed, "g").unwrap().strike, 1);
        assert_eq!(log.recent().len(), 7, "the row still shows the failures before the lift");
    }

    #[tokio::test(start_paused = true)]
    async fn the_row_keeps_the_newest_failures() {
        let p = policy(100, 60, 10, 3600);
        let mut log = FailureLog::default();
        for i in 0..20 {
            log.record(&p, FailureKind::LoadFailed, &i.to_string());
        }
        let shown: Vec<_> = log.recent().into_iter().map(|f| f.message).collect();
        assert_eq!(shown, (12..20).map(|i| i.to_string()).collect::<Vec<_>>());
    }
}
