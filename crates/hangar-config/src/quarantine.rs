//! The `quarantine` section: when a model that keeps failing stops being loaded on demand.

use std::num::NonZeroU32;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// `quarantine` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct QuarantineFields {
    /// Failed loads and crashes within `window_seconds` that quarantine a model. Default 3.
    failures: Option<u32>,
    /// Seconds over which failures are counted. Default 600.
    window_seconds: Option<u32>,
    /// Length of a first quarantine in seconds; each further one before the model has
    /// gone a whole window without failing doubles it. Default 30.
    backoff_seconds: Option<u32>,
    /// Longest quarantine in seconds. Default 3600.
    max_backoff_seconds: Option<u32>,
}

impl Section for QuarantineFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("failures", self.failures, 1);
        p.at_least("window_seconds", self.window_seconds, 1);
        p.at_least("backoff_seconds", self.backoff_seconds, 1);
        p.at_least("max_backoff_seconds", self.max_backoff_seconds, 1);
        if let (Some(max), Some(first)) = (self.max_backoff_seconds, self.backoff_seconds)
            && max < first
        {
            p.push("max_backoff_seconds", format!("must be >= backoff_seconds ({first})"));
        }
    }
}

/// When a model is quarantined: after `failures` failed loads or crashes within `window`,
/// requests and auto-loads are refused for `backoff`, doubling up to `max_backoff` while
/// it keeps failing. An explicit load lifts a quarantine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantinePolicy {
    /// Failures within the window that quarantine the model.
    pub failures: NonZeroU32,
    /// How far back failures are counted.
    pub window: Duration,
    /// The first quarantine's length.
    pub backoff: Duration,
    /// The longest quarantine.
    pub max_backoff: Duration,
}

/// Default `quarantine.failures`.
pub const DEFAULT_QUARANTINE_FAILURES: u32 = 3;
/// Default `quarantine.window_seconds`.
pub const DEFAULT_QUARANTINE_WINDOW_S: u64 = 600;
/// Default `quarantine.backoff_seconds`.
pub const DEFAULT_QUARANTINE_BACKOFF_S: u64 = 30;
/// Default `quarantine.max_backoff_seconds`.
pub const DEFAULT_QUARANTINE_MAX_BACKOFF_S: u64 = 3600;

impl Default for QuarantinePolicy {
    fn default() -> Self {
        Self::from(QuarantineFields::default())
    }
}

impl From<QuarantineFields> for QuarantinePolicy {
    fn from(f: QuarantineFields) -> Self {
        let secs = |v: Option<u32>, default: u64| Duration::from_secs(v.map_or(default, u64::from));
        let backoff = secs(f.backoff_seconds, DEFAULT_QUARANTINE_BACKOFF_S);
        Self {
            failures: f
                .failures
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::new(DEFAULT_QUARANTINE_FAILURES).unwrap_or(NonZeroU32::MIN)),
            window: secs(f.window_seconds, DEFAULT_QUARANTINE_WINDOW_S),
            backoff,
            max_backoff: secs(f.max_backoff_seconds, DEFAULT_QUARANTINE_MAX_BACKOFF_S).max(backoff),
        }
    }
}
