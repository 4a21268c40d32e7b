//! The connections of one listener and what each is doing, as a plain struct: the
//! connection cap's decision ([`decide`]), which connection to give up first, and when a
//! connection that sends no request is closed. The clock is a parameter; tests drive the
//! struct directly.

use std::collections::{BTreeMap, HashMap};
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
    /// At the cap: close this connection, the one that has waited longest for a request,
    /// and keep the new one.
    Shed(ConnId),
    /// At the cap and every connection has a request in flight: close the new one.
    Refuse,
}

/// The cap's rule: below `max` every connection is kept; at it, the connection that has
/// waited longest for a request makes room (a half-open connection still sending its head
/// is such a connection, and so is a kept-alive one between requests); when none waits,
/// the new connection is refused.
pub(crate) fn decide(open: usize, max: usize, longest_waiting: Option<ConnId>) -> Decision {
    if open < max {
        return Decision::Accept;
    }
    match longest_waiting {
        Some(id) => Decision::Shed(id),
        None => Decision::Refuse,
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
    /// A request is in flight: no deadline.
    Busy,
    /// Close the connection at this instant unless a request starts.
    Until(Instant),
    /// The connection was shed: close it now.
    Gone,
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
}

/// The open connections of one listener.
pub(crate) struct Registry {
    max: usize,
    header_timeout: Duration,
    idle_timeout: Duration,
    conns: HashMap<ConnId, Entry>,
    /// Connections with no request in flight, in the order they began to wait.
    waiting: BTreeMap<u64, ConnId>,
    next_id: ConnId,
    next_seq: u64,
}

impl Registry {
    /// No connections, under `limits`.
    pub(crate) fn new(limits: &ConnectionLimits) -> Self {
        Self {
            max: usize::try_from(limits.max_connections.get()).unwrap_or(usize::MAX),
            header_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            conns: HashMap::new(),
            waiting: BTreeMap::new(),
            next_id: 0,
            next_seq: 0,
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
    /// refused (every connection has a request in flight).
    pub(crate) fn admit(&mut self, now: Instant) -> Option<Admitted> {
        let longest = self.waiting.first_key_value().map(|(_, &id)| id);
        let shed = match decide(self.conns.len(), self.max, longest) {
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
        self.conns.insert(id, Entry { phase: Phase::New, since: now, seq, shed: tx });
        Some(Admitted { id, shed, signal })
    }

    /// Closes the connection that has waited longest for a request, if one waits (a
    /// descriptor or buffer ran short: this gives one back).
    pub(crate) fn shed_longest_waiting(&mut self) -> Option<ConnId> {
        let (_, &victim) = self.waiting.first_key_value()?;
        self.shed(victim);
        Some(victim)
    }

    /// A request head arrived on `id`.
    pub(crate) fn request_started(&mut self, id: ConnId) {
        let Some(entry) = self.conns.get_mut(&id) else { return };
        entry.phase = match entry.phase {
            Phase::New | Phase::Idle => {
                self.waiting.remove(&entry.seq);
                Phase::Busy(1)
            }
            Phase::Busy(n) => Phase::Busy(n.saturating_add(1)),
        };
    }

    /// A request on `id` ended (its answer was sent, or dropped) at `now`.
    pub(crate) fn request_ended(&mut self, id: ConnId, now: Instant) {
        let seq = self.next_seq;
        let Some(entry) = self.conns.get_mut(&id) else { return };
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

    /// When connection `id` is to be closed if no request starts.
    pub(crate) fn watch(&self, id: ConnId) -> Watch {
        match self.conns.get(&id) {
            None => Watch::Gone,
            Some(Entry { phase: Phase::Busy(_), .. }) => Watch::Busy,
            Some(Entry { phase: Phase::New, since, .. }) => {
                Watch::Until(*since + self.header_timeout)
            }
            Some(Entry { phase: Phase::Idle, since, .. }) => {
                Watch::Until(*since + self.idle_timeout)
            }
        }
    }

    /// How long a busy connection's watchdog sleeps before it looks again.
    pub(crate) fn recheck(&self) -> Duration {
        self.header_timeout.min(self.idle_timeout)
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
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[test]
    fn the_cap_keeps_below_it_sheds_the_longest_waiting_at_it_and_refuses_when_none_waits() {
        use Decision::*;
        let cases = [
            (0, 2, None, Accept),
            (1, 2, Some(0), Accept),
            (2, 2, Some(7), Shed(7)),
            (2, 2, None, Refuse),
            (5, 2, Some(3), Shed(3)),
        ];
        for (open, max, longest, expected) in cases {
            assert_eq!(decide(open, max, longest), expected, "{open} open, cap {max}");
        }
    }

    /// A step of a connection history: connections are named by accept order.
    #[derive(Clone, Copy)]
    enum Op {
        Open,
        Start(ConnId),
        End(ConnId),
        Close(ConnId),
    }

    #[derive(Debug, PartialEq)]
    enum Next {
        Accept,
        Shed(ConnId),
        Refuse,
    }

    fn limits(max: u32) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: NonZeroU32::new(max).unwrap(),
            header_read_timeout: Duration::from_secs(20),
            body_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
        }
    }

    /// Plays `ops` on a registry capped at `max`, then admits one more connection.
    fn check(rule: &str, max: u32, ops: &[Op], expected: Next) {
        let mut registry = Registry::new(&limits(max));
        let now = Instant::now();
        for op in ops {
            match *op {
                Op::Open => assert!(registry.admit(now).is_some(), "{rule}: setup refused"),
                Op::Start(id) => registry.request_started(id),
                Op::End(id) => registry.request_ended(id, now),
                Op::Close(id) => registry.closed(id),
            }
        }
        let open = registry.open();
        let next = match registry.admit(now) {
            None => Next::Refuse,
            Some(Admitted { shed: None, .. }) => Next::Accept,
            Some(Admitted { shed: Some(victim), .. }) => Next::Shed(victim),
        };
        assert_eq!(next, expected, "{rule}");
        let after = match next {
            Next::Accept => open + 1,
            Next::Shed(victim) => {
                assert_eq!(registry.phase(victim), None, "{rule}: the victim is gone");
                open
            }
            Next::Refuse => open,
        };
        assert_eq!(registry.open(), after, "{rule}: open count");
    }

    #[test]
    fn which_connection_makes_room() {
        use Op::*;
        check("below the cap", 3, &[Open, Open], Next::Accept);
        check("the oldest half-open connection goes first", 2, &[Open, Open], Next::Shed(0));
        check("a busy connection is never shed", 2, &[Open, Open, Start(0)], Next::Shed(1));
        check("every connection busy: refused", 2, &[Open, Open, Start(0), Start(1)], Next::Refuse);
        check(
            "a kept-alive connection waits from the end of its last request",
            2,
            &[Open, Open, Start(0), End(0)],
            Next::Shed(1),
        );
        check(
            "an idle connection that waited longer than a new one goes first",
            2,
            &[Open, Start(0), End(0), Open],
            Next::Shed(0),
        );
        check(
            "one of two streams ended: still busy",
            2,
            &[Open, Open, Start(0), Start(0), End(0), Start(1)],
            Next::Refuse,
        );
        check(
            "a busy connection older than every waiting one is passed over",
            3,
            &[Open, Start(0), Open, Open],
            Next::Shed(1),
        );
        check("a closed connection frees its place", 2, &[Open, Open, Close(0)], Next::Accept);
        check(
            "a shed connection is not shed twice",
            2,
            &[Open, Open, Open, Start(2)],
            Next::Shed(1),
        );
    }

    #[test]
    fn a_shed_connection_is_told() {
        let mut registry = Registry::new(&limits(1));
        let now = Instant::now();
        let mut first = registry.admit(now).unwrap();
        assert!(first.signal.try_recv().is_err(), "not shed yet");
        let second = registry.admit(now).unwrap();
        assert_eq!(second.shed, Some(first.id));
        assert!(first.signal.try_recv().is_ok(), "told to close");
        assert_eq!(registry.watch(first.id), Watch::Gone);
        registry.closed(first.id);
        assert_eq!(registry.open(), 1, "closing a shed connection changes nothing");
    }

    #[test]
    fn deadlines_follow_what_the_connection_is_doing() {
        let mut registry = Registry::new(&limits(4));
        let t0 = Instant::now();
        let id = registry.admit(t0).unwrap().id;
        assert_eq!(registry.watch(id), Watch::Until(t0 + Duration::from_secs(20)), "new");
        registry.request_started(id);
        assert_eq!(registry.watch(id), Watch::Busy);
        let t1 = t0 + Duration::from_secs(300);
        registry.request_ended(id, t1);
        assert_eq!(registry.watch(id), Watch::Until(t1 + Duration::from_secs(120)), "idle");
        assert_eq!(registry.phase(id), Some(Phase::Idle));
        assert_eq!(registry.recheck(), Duration::from_secs(20));
    }

    #[test]
    fn a_resource_shortage_sheds_the_longest_waiting_connection() {
        let mut registry = Registry::new(&limits(8));
        let now = Instant::now();
        let a = registry.admit(now).unwrap().id;
        let b = registry.admit(now).unwrap().id;
        registry.request_started(a);
        assert_eq!(registry.shed_longest_waiting(), Some(b));
        assert_eq!(registry.shed_longest_waiting(), None, "only busy ones left");
        assert_eq!(registry.phase(a), Some(Phase::Busy(1)));
    }
}
