//! The awaited release, decided in [`step`](super::step): after an unload of a GPU model,
//! the next load on those GPUs waits until their used memory shows the model's memory
//! given back, at most [`RELEASE_WAIT`] after the last unload there (the driver frees
//! memory late, and a load admitted or measured before that would count it twice).
//!
//! Releases are kept per GPU, so a load on GPU 0 does not wait for one on GPU 1 (which a
//! load running there at once could hide). A model whose GPUs are unknown (loaded with no
//! placement and never measured per GPU) is awaited on [`ALL_GPUS`], their sum, which every
//! GPU load waits for.
//!
//! - [`Command::Released`](super::Command::Released): an unload expects each GPU's used
//!   memory, `used_before` it, to come down by 90% of what the model held there; a release
//!   still pending there is part of `used_before` if it has not shown yet, so the target is
//!   taken from the lower of the two;
//! - [`Command::AwaitRelease`](super::Command::AwaitRelease), for a load `on` some GPUs
//!   (empty: any), with the GPUs' used memory read by the caller (`None`: not read yet):
//!   go when nothing is pending there or every pending release came down (settled), or
//!   when the last wait ran out (not settled: a delta measured now would be wrong); else
//!   wait, or read the GPUs first;
//! - a crash decided ([`Change::Crash`](super::Change)) tears the model's runtimes down
//!   after the move, out of the loop: until
//!   [`Command::TornDown`](super::Command::TornDown) says what that gives back, every GPU
//!   load waits (a woken engine that answered wrong still holds its memory, which the
//!   model's state no longer shows), at most [`RELEASE_WAIT`] after the crash.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{Effect, State};
use crate::gpu::RELEASE_WAIT;

/// The key of a release awaited on the sum of every GPU's used memory.
pub(crate) const ALL_GPUS: u32 = u32::MAX;

/// Memory an unload should give back on one GPU (or [`ALL_GPUS`]): its used memory should
/// come down to `target_used_mib` by `deadline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Release {
    target_used_mib: u64,
    deadline: Instant,
}

/// The releases pending, by GPU.
pub(super) type Releases = BTreeMap<u32, Release>;

/// The teardowns after a crash not done yet, by model: until when each is waited for.
pub(super) type Teardowns = BTreeMap<usize, Instant>;

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

/// One GPU's side of an unload: `(gpu, used_before, held)` in MiB.
pub(crate) type GpuRelease = (u32, u64, u64);

/// What a waiting load asks with: the GPUs it may use (empty: any), and each GPU's used
/// memory (`None`: not read yet).
pub(super) type Asked<'a> = (&'a [u32], Option<&'a [(u32, u64)]>);

/// An unload expects `held` MiB back from `used_before` on each GPU it names.
pub(super) fn released<W>(state: &mut State<W>, releases: Vec<GpuRelease>, now: Instant) {
    for (gpu, used_before, held) in releases {
        let base =
            state.release.get(&gpu).map_or(used_before, |r| r.target_used_mib.min(used_before));
        let release = Release {
            target_used_mib: base.saturating_sub(held - held / 10),
            deadline: now + RELEASE_WAIT,
        };
        state.release.insert(gpu, release);
    }
}

/// A crash of `model` was decided: its teardown is awaited.
pub(super) fn tearing<W>(state: &mut State<W>, model: usize, now: Instant) {
    state.tearing.insert(model, now + RELEASE_WAIT);
}

/// `model`'s teardown after a crash is done, expecting `releases` (none: nothing to wait
/// for, a dead engine's memory is gone).
pub(super) fn torn_down<W>(
    state: &mut State<W>,
    model: usize,
    releases: Vec<GpuRelease>,
    now: Instant,
) {
    state.tearing.remove(&model);
    released(state, releases, now);
}

/// Answers a load `on` some GPUs (empty: any) waiting for the releases pending there, with
/// each GPU's `used` memory (and [`ALL_GPUS`]' sum).
pub(super) fn await_release<W, P>(
    state: &mut State<W>,
    (on, used): Asked<'_>,
    waiter: W,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let pending: Vec<(u32, Release)> = state
        .release
        .iter()
        .filter(|(gpu, _)| **gpu == ALL_GPUS || on.is_empty() || on.contains(gpu))
        .map(|(gpu, r)| (*gpu, *r))
        .collect();
    let tearing = state.tearing.values().any(|until| now < *until);
    let mut answer = match used {
        _ if tearing => ReleaseAnswer::Wait,
        _ if pending.is_empty() => ReleaseAnswer::Go { settled: true },
        None => ReleaseAnswer::Read,
        Some(used) => {
            let reading = |gpu: u32| used.iter().find(|(g, _)| *g == gpu).map(|(_, mib)| *mib);
            let down =
                |(gpu, r): &(u32, Release)| reading(*gpu).is_some_and(|u| u <= r.target_used_mib);
            if pending.iter().all(|p| down(p) || now >= p.1.deadline) {
                for (gpu, _) in &pending {
                    state.release.remove(gpu);
                }
                ReleaseAnswer::Go { settled: pending.iter().all(down) }
            } else {
                ReleaseAnswer::Wait
            }
        }
    };
    // Teardowns that ran out: what they give back was never said.
    if let ReleaseAnswer::Go { settled } = &mut answer
        && !state.tearing.is_empty()
    {
        state.tearing.clear();
        *settled = false;
    }
    effects.push(Effect::Release { waiter, answer });
}
