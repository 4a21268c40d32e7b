//! The awaited release, decided in [`step`](super::step): after an unload of a GPU model,
//! the next GPU load waits until the GPUs' used memory shows the model's memory given
//! back, at most [`RELEASE_WAIT`] after the last unload (the driver frees memory late, and
//! a load admitted or measured before that would count it twice).
//!
//! - [`Command::Released`](super::Command::Released): an unload expects the GPUs' used
//!   memory, `used_before` it, to come down by 90% of what the model held; a release still
//!   pending is part of `used_before` if it has not shown yet, so the target is taken from
//!   the lower of the two;
//! - [`Command::AwaitRelease`](super::Command::AwaitRelease) with the GPUs' used memory
//!   read by the caller (`None`: not read yet): go when nothing is pending or the memory
//!   came down (settled), or when the wait ran out (not settled: a delta measured now
//!   would be wrong); else wait, or read the GPUs first.

use tokio::time::Instant;

use super::{Effect, State};
use crate::gpu::RELEASE_WAIT;

/// Memory an unload should give back: the GPUs' used memory in all should come down to
/// `target_used_mib` by `deadline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Release {
    target_used_mib: u64,
    deadline: Instant,
}

/// What a load waiting for a release does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseAnswer {
    /// Go; `settled`: every release showed (else the wait ran out).
    Go { settled: bool },
    /// A release is pending: read the GPUs' used memory and ask again.
    Read,
    /// Not released yet: read again a little later.
    Wait,
}

/// An unload expects `held` MiB back from `used_before`.
pub(super) fn released<W>(state: &mut State<W>, used_before: u64, held: u64, now: Instant) {
    let base = state.release.map_or(used_before, |r| r.target_used_mib.min(used_before));
    state.release = Some(Release {
        target_used_mib: base.saturating_sub(held - held / 10),
        deadline: now + RELEASE_WAIT,
    });
}

/// Answers a load waiting for the pending release with the GPUs' `used` memory.
pub(super) fn await_release<W, P>(
    state: &mut State<W>,
    used: Option<u64>,
    waiter: W,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let answer = match (state.release, used) {
        (None, _) => ReleaseAnswer::Go { settled: true },
        (Some(_), None) => ReleaseAnswer::Read,
        (Some(r), Some(used)) if used <= r.target_used_mib || now >= r.deadline => {
            state.release = None;
            ReleaseAnswer::Go { settled: used <= r.target_used_mib }
        }
        (Some(_), Some(_)) => ReleaseAnswer::Wait,
    };
    effects.push(Effect::Release { waiter, answer });
}
