//! [`StubGpu`]: a pretend GPU for the stub engine, so the runtime's VRAM measurement,
//! admission and release rules can be tested without one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A pretend GPU: a stub replica of a model given a footprint ([`StubGpu::set_footprint`])
/// takes that much memory while loaded, and gives it back when unloaded — at once, or,
/// while [`StubGpu::lag_releases`] is on, only when [`StubGpu::release_now`] is called (a
/// driver that has not yet shown the memory as free).
#[derive(Debug, Default)]
pub struct StubGpu(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    base_mib: u64,
    footprints: HashMap<String, u64>,
    held_mib: u64,
    lagging_mib: u64,
    lag: bool,
}

impl StubGpu {
    /// A pretend GPU with `base_mib` in use by something else.
    pub fn new(base_mib: u64) -> Arc<Self> {
        Arc::new(Self(Mutex::new(State { base_mib, ..State::default() })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Each replica of `model` takes `mib` while loaded.
    pub fn set_footprint(&self, model: &str, mib: u64) {
        self.state().footprints.insert(model.to_owned(), mib);
    }

    /// Memory in use now: the base, loaded replicas, and releases not yet shown.
    pub fn used_mib(&self) -> u64 {
        let s = self.state();
        s.base_mib + s.held_mib + s.lagging_mib
    }

    /// Memory loaded replicas hold now (no base, no lagging releases).
    pub fn loaded_mib(&self) -> u64 {
        self.state().held_mib
    }

    /// While on, unloaded memory stays in use until [`StubGpu::release_now`].
    pub fn lag_releases(&self, lag: bool) {
        self.state().lag = lag;
    }

    /// Shows every lagging release as free.
    pub fn release_now(&self) {
        self.state().lagging_mib = 0;
    }

    /// A replica of `model` loads: takes its footprint (returned, 0 when it has none).
    pub(crate) fn take(&self, model: &str) -> u64 {
        let mut s = self.state();
        let mib = s.footprints.get(model).copied().unwrap_or(0);
        s.held_mib += mib;
        mib
    }

    /// A sleeping replica wakes: takes back the `mib` it gave.
    pub(crate) fn take_back(&self, mib: u64) {
        self.state().held_mib += mib;
    }

    /// A replica unloads (or sleeps): gives back `mib`.
    pub(crate) fn give(&self, mib: u64) {
        let mut s = self.state();
        s.held_mib = s.held_mib.saturating_sub(mib);
        if s.lag {
            s.lagging_mib += mib;
        }
    }
}
