//! The connections of one listener and what each is doing, as a plain struct: the
//! connection cap's decision ([`decide`]), which connection to give up first, when a
//! connection that sends no request or takes no bytes is closed, and which calls a
//! connection may carry without a key ([`gate`]). The clock is a parameter; tests drive the
//! struct directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hangar_config::ConnectionLimits;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A connection of one listener, numbered from 0 in accept order.
pub(crate) type ConnId = u64;

/// What the cap decides for a connection just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Below the cap: keep it.
    Accept,
    /// At the cap: close this connection (the longest-stalled, else the one that has
    /// waited longest for a request) and keep the new one.
    Shed(ConnId),
    /// At the cap and every connection has a request in flight that is not stalled:
    /// close the new one.
    Refuse,
}

/// The cap's rule: below `max` every connection is kept; at it, the connection whose
/// answers have waited longest for a peer that takes no bytes makes room, else the one
/// that has waited longest for a request (a half-open connection still sending its head
/// is such a connection, and so is a kept-alive one between requests); when none of
/// either, the new connection is refused.
pub(crate) fn decide(
    open: usize,
    max: usize,
    longest_stalled: Option<ConnId>,
    longest_waiting: Option<ConnId>,
) -> Decision {
    if open < max {
        return Decision::Accept;
    }
    match longest_stalled.or(longest_waiting) {
        Some(id) => Decision::Shed(id),
        None => Decision::Refuse,
    }
}

/// How a call's key lets it onto its connection, as [`crate::auth::classify`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallClass {
    /// A valid key, or a server with no key set: nothing to bound.
    Keyed,
    /// Let in without a valid key while keys are set (an open route, the local agent).
    Keyless,
    /// Refused by the keys.
    Refused,
}

/// What the listener does with a call before a byte of its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Serve it (a keyed call, or a keyless one under the connection's bound).
    Pass,
    /// Answer its refusal (the keys' 401 or 403).
    Refuse,
    /// Refuse it: the connection already runs its bound of keyless calls.
    TooManyKeyless,
    /// Close the connection, unanswered: it sent more refused calls than it may.
    Close,
}

/// The gate's rule: keyed calls pass; a keyless one passes while the connection runs
/// fewer than `max_keyless` of them, else it is refused; each refused call counts, and
/// the one after `max_refused` closes the connection.
pub(crate) fn gate(
    class: CallClass,
    keyless_running: u32,
    refused_before: u32,
    max_keyless: u32,
    max_refused: u32,
) -> Gate {
    let refusal = |gate| if refused_before >= max_refused { Gate::Close } else { gate };
    match class {
        CallClass::Keyed => Gate::Pass,
        CallClass::Keyless if keyless_running < max_keyless => Gate::Pass,
        CallClass::Keyless => refusal(Gate::TooManyKeyless),
        CallClass::Refused => refusal(Gate::Refuse),
    }
}

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Accepted; no complete request head yet.
    New,
    /// Has had requests, none in flight: waits for the next.
    Idle,
    /// This many requests in flight (HTTP/2 runs several).
    Busy(u32),
}

/// When the watchdog of a connection should act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    /// A request is in flight and not stalled: no deadline.
    Busy,
    /// Close the connection at this instant unless a request starts.
    Until(Instant),
    /// Every answer in flight waits for the peer to take bytes: close the connection at
    /// this instant unless one of them moves.
    Stalled(Instant),
    /// The connection was shed: close it now.
    Gone,
}

/// Since when one answer has waited for its peer to take its bytes: set when the answer,
/// or its next piece, is handed to the connection; cleared when the connection asks for
/// more (the peer took the last piece) and while the answer computes its next piece.
/// Atomic: the answer's body sets it on every piece without the registry's lock.
#[derive(Debug)]
pub(crate) struct Owed {
    epoch: Instant,
    /// Nanoseconds from `epoch`, plus one; 0 while nothing is owed.
    since: AtomicU64,
}

impl Owed {
    fn new(epoch: Instant) -> Self {
        Self { epoch, since: AtomicU64::new(0) }
    }

    /// A piece was handed to the connection at `now`.
    pub(crate) fn owe(&self, now: Instant) {
        let nanos = now.saturating_duration_since(self.epoch).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX - 1);
        self.since.store(nanos + 1, Ordering::Relaxed);
    }

    /// The peer took what was handed over, or nothing is pending.
    pub(crate) fn settle(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// Since when a piece waits, if one does.
    pub(crate) fn since(&self) -> Option<Instant> {
        match self.since.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.epoch + Duration::from_nanos(n - 1)),
        }
    }
}

/// A connection just admitted.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// Its number.
    pub(crate) id: ConnId,
    /// The connection closed to make room for it, if any.
    pub(crate) shed: Option<ConnId>,
    /// Fires when this connection is shed in turn.
    pub(crate) signal: oneshot::Receiver<()>,
}

struct Entry {
    phase: Phase,
    /// When it last began to wait for a request (accept, or the end of its last request).
    since: Instant,
    /// Its key in `waiting` while it waits.
    seq: u64,
    /// Tells its connection task to close.
    shed: oneshot::Sender<()>,
    /// The stall clocks of its requests in flight.
    answers: Vec<Arc<Owed>>,
    /// Keyless calls running.
    keyless: u32,
    /// Calls refused so far.
    refused: u32,
}

impl Entry {
    /// Since when every answer in flight has waited for the peer, if all do.
    fn stalled_since(&self) -> Option<Instant> {
        if self.answers.is_empty() {
            return None;
        }
        self.answers
            .iter()
            .map(|a| a.since())
            .try_fold(None, |latest: Option<Instant>, since| {
                since.map(|s| Some(latest.map_or(s, |l| l.max(s))))
            })?
    }
}

/// The bounds a registry applies, besides the cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// `connections.header_read_timeout_s`.
    pub(crate) header_timeout: Duration,
    /// `connections.idle_timeout_s`.
    pub(crate) idle_timeout: Duration,
    /// `http.stream_write_timeout_s`: how long every answer of a connection may wait for
    /// a peer that takes no bytes.
    pub(crate) stall_timeout: Duration,
    /// `connections.max_keyless_streams`.
    pub(crate) max_keyless: u32,
    /// `connections.max_refused_calls`.
    pub(crate) max_refused: u32,
}

/// How long a connection's answers must have waited before the cap sheds it for a new
/// one: an answer just handed to a healthy peer waits microseconds.
const SHED_STALLED_AFTER: Duration = Duration::from_secs(1);

/// The open connections of one listener.
pub(crate) struct Registry {
    max: usize,
    bounds: Bounds,
    conns: HashMap<ConnId, Entry>,
    /// Connections with no request in flight, in the order they began to wait.
    waiting: BTreeMap<u64, ConnId>,
    next_id: ConnId,
    next_seq: u64,
    epoch: Instant,
}

impl Registry {
    /// No connections, under `limits`; answers stall after `stall_timeout`.
    pub(crate) fn new(limits: &ConnectionLimits, stall_timeout: Duration) -> Self {
        Self {
            max: usize::try_from(limits.max_connections.get()).unwrap_or(usize::MAX),
            bounds: Bounds {
                header_timeout: limits.header_read_timeout,
                idle_timeout: limits.idle_timeout,
                stall_timeout,
                max_keyless: limits.max_keyless_streams.get(),
                max_refused: limits.max_refused_calls.get(),
            },
            conns: HashMap::new(),
            waiting: BTreeMap::new(),
            next_id: 0,
            next_seq: 0,
            epoch: Instant::now(),
        }
    }

    /// Connections open.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.conns.len()
    }

    /// What connection `id` is doing; `None` once it is closed or shed.
    #[cfg(test)]
    pub(crate) fn phase(&self, id: ConnId) -> Option<Phase> {
        self.conns.get(&id).map(|e| e.phase)
    }

    /// Admits a connection accepted at `now`, shedding another when at the cap; `None`:
    /// refused (every connection has a request in flight that is not stalled).
    pub(crate) fn admit(&mut self, now: Instant) -> Option<Admitted> {
        let longest = self.waiting.first_key_value().map(|(_, &id)| id);
        let stalled = if self.conns.len() < self.max { None } else { self.longest_stalled(now) };
        let shed = match decide(self.conns.len(), self.max, stalled, longest) {
            Decision::Accept => None,
            Decision::Shed(victim) => {
                self.shed(victim);
                Some(victim)
            }
            Decision::Refuse => return None,
        };
        let id = self.next_id;
        self.next_id += 1;
        let (tx, signal) = oneshot::channel();
        let seq = self.wait(id);
        let entry = Entry {
            phase: Phase::New,
            since: now,
            seq,
            shed: tx,
            answers: Vec::new(),
            keyless: 0,
            refused: 0,
        };
        self.conns.insert(id, entry);
        Some(Admitted { id, shed, signal })
    }

    /// The connection whose every answer has waited longest for its peer, at least
    /// [`SHED_STALLED_AFTER`].
    fn longest_stalled(&self, now: Instant) -> Option<ConnId> {
        let stalled = self.conns.iter().filter_map(|(&id, e)| Some((e.stalled_since()?, id)));
        stalled
            .filter(|(since, _)| now.saturating_duration_since(*since) >= SHED_STALLED_AFTER)
            .min()
            .map(|(_, id)| id)
    }

    /// Closes the connection that has waited longest for a request, if one waits (a
    /// descriptor or buffer ran short: this gives one back).
    pub(crate) fn shed_longest_waiting(&mut self) -> Option<ConnId> {
        let (_, &victim) = self.waiting.first_key_value()?;
        self.shed(victim);
        Some(victim)
    }

    /// A request head arrived on `id`: the returned clock is its answer's.
    pub(crate) fn request_started(&mut self, id: ConnId) -> Arc<Owed> {
        let owed = Arc::new(Owed::new(self.epoch));
        let Some(entry) = self.conns.get_mut(&id) else { return owed };
        entry.phase = match entry.phase {
            Phase::New | Phase::Idle => {
                self.waiting.remove(&entry.seq);
                Phase::Busy(1)
            }
            Phase::Busy(n) => Phase::Busy(n.saturating_add(1)),
        };
        entry.answers.push(Arc::clone(&owed));
        owed
    }

    /// Whether call `class` may go on connection `id`, counted: a keyless call that
    /// passes runs until [`Self::request_ended`] says `keyless`; a refusal counts; a
    /// closing one sheds the connection.
    pub(crate) fn gate(&mut self, id: ConnId, class: CallClass) -> Gate {
        let Bounds { max_keyless, max_refused, .. } = self.bounds;
        let Some(entry) = self.conns.get_mut(&id) else { return Gate::Close };
        let verdict = gate(class, entry.keyless, entry.refused, max_keyless, max_refused);
        match verdict {
            Gate::Pass if class == CallClass::Keyless => entry.keyless += 1,
            Gate::Pass => {}
            Gate::Refuse | Gate::TooManyKeyless => entry.refused += 1,
            Gate::Close => self.shed(id),
        }
        verdict
    }

    /// A request on `id` ended (its answer was sent, or dropped) at `now`; `keyless` when
    /// its call passed the gate as keyless.
    pub(crate) fn request_ended(
        &mut self,
        id: ConnId,
        owed: &Arc<Owed>,
        keyless: bool,
        now: Instant,
    ) {
        let seq = self.next_seq;
        let Some(entry) = self.conns.get_mut(&id) else { return };
        entry.answers.retain(|a| !Arc::ptr_eq(a, owed));
        if keyless {
            entry.keyless = entry.keyless.saturating_sub(1);
        }
        match entry.phase {
            Phase::Busy(n) if n > 1 => entry.phase = Phase::Busy(n - 1),
            Phase::Busy(_) => {
                entry.phase = Phase::Idle;
                entry.since = now;
                entry.seq = seq;
                self.next_seq += 1;
                self.waiting.insert(seq, id);
            }
            Phase::New | Phase::Idle => {}
        }
    }

    /// Connection `id` closed (its task ended).
    pub(crate) fn closed(&mut self, id: ConnId) {
        if let Some(entry) = self.conns.remove(&id) {
            self.waiting.remove(&entry.seq);
        }
    }

    /// When connection `id` is to be closed if nothing changes.
    pub(crate) fn watch(&self, id: ConnId) -> Watch {
        let Bounds { header_timeout, idle_timeout, stall_timeout, .. } = self.bounds;
        match self.conns.get(&id) {
            None => Watch::Gone,
            Some(entry @ Entry { phase: Phase::Busy(_), .. }) => match entry.stalled_since() {
                Some(since) => Watch::Stalled(since + stall_timeout),
                None => Watch::Busy,
            },
            Some(Entry { phase: Phase::New, since, .. }) => Watch::Until(*since + header_timeout),
            Some(Entry { phase: Phase::Idle, since, .. }) => Watch::Until(*since + idle_timeout),
        }
    }

    /// How long a busy connection's watchdog sleeps before it looks again.
    pub(crate) fn recheck(&self) -> Duration {
        let Bounds { header_timeout, idle_timeout, stall_timeout, .. } = self.bounds;
        header_timeout.min(idle_timeout).min(stall_timeout)
    }

    fn wait(&mut self, id: ConnId) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.waiting.insert(seq, id);
        seq
    }

    fn shed(&mut self, victim: ConnId) {
        if let Some(entry) = self.conns.remove(&victim) {
            self.waiting.remove(&entry.seq);
            let _ = entry.shed.send(());
        }
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
