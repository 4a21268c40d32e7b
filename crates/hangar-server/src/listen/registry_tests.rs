//! The registry's rules, driven with an explicit clock.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::*;

#[test]
fn the_cap_keeps_below_it_sheds_the_longest_stalled_then_the_longest_waiting_at_it() {
    use Decision::*;
    // (open, cap, longest stalled, longest waiting, decision)
    let cases = [
        (0, 2, None, None, Accept),
        (1, 2, Some(4), Some(0), Accept),
        (2, 2, None, Some(7), Shed(7)),
        (2, 2, Some(4), Some(7), Shed(4)),
        (2, 2, Some(4), None, Shed(4)),
        (2, 2, None, None, Refuse),
        (5, 2, None, Some(3), Shed(3)),
    ];
    for (open, max, stalled, longest, expected) in cases {
        assert_eq!(decide(open, max, stalled, longest), expected, "{open} open, cap {max}");
    }
}

#[test]
fn the_gate_passes_keyed_calls_bounds_keyless_ones_and_closes_after_refusals() {
    use CallClass::*;
    use Gate::*;
    // (class, keyless running, refused before, gate) with at most 2 keyless and 3 refused.
    let cases = [
        (Keyed, 0, 0, Pass),
        (Keyed, 9, 9, Pass),
        (Keyless, 0, 0, Pass),
        (Keyless, 1, 3, Pass),
        (Keyless, 2, 0, TooManyKeyless),
        (Keyless, 2, 3, Close),
        (Refused, 0, 0, Refuse),
        (Refused, 0, 2, Refuse),
        (Refused, 0, 3, Close),
    ];
    for (class, keyless, refused, expected) in cases {
        assert_eq!(gate(class, keyless, refused, 2, 3), expected, "{class:?} {keyless} {refused}");
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
        max_keyless_streams: NonZeroU32::new(2).unwrap(),
        max_refused_calls: NonZeroU32::new(3).unwrap(),
    }
}

/// How long answers may wait for a peer in these tests.
const STALL: Duration = Duration::from_secs(60);

/// Plays `ops` on a registry capped at `max`, then admits one more connection.
fn check(rule: &str, max: u32, ops: &[Op], expected: Next) {
    let mut registry = Registry::new(&limits(max), STALL);
    let now = Instant::now();
    let mut running: HashMap<ConnId, Vec<Arc<Owed>>> = HashMap::new();
    for op in ops {
        match *op {
            Op::Open => assert!(registry.admit(now).is_some(), "{rule}: setup refused"),
            Op::Start(id) => running.entry(id).or_default().push(registry.request_started(id)),
            Op::End(id) => {
                let owed = running.get_mut(&id).and_then(Vec::pop).expect("a started request");
                registry.request_ended(id, &owed, false, now);
            }
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
    check("a shed connection is not shed twice", 2, &[Open, Open, Open, Start(2)], Next::Shed(1));
}

#[test]
fn a_shed_connection_is_told() {
    let mut registry = Registry::new(&limits(1), STALL);
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
    let mut registry = Registry::new(&limits(4), STALL);
    let t0 = Instant::now();
    let id = registry.admit(t0).unwrap().id;
    assert_eq!(registry.watch(id), Watch::Until(t0 + Duration::from_secs(20)), "new");
    let owed = registry.request_started(id);
    assert_eq!(registry.watch(id), Watch::Busy);
    let t1 = t0 + Duration::from_secs(300);
    registry.request_ended(id, &owed, false, t1);
    assert_eq!(registry.watch(id), Watch::Until(t1 + Duration::from_secs(120)), "idle");
    assert_eq!(registry.phase(id), Some(Phase::Idle));
    assert_eq!(registry.recheck(), Duration::from_secs(20));
}

#[test]
fn a_resource_shortage_sheds_the_longest_waiting_connection() {
    let mut registry = Registry::new(&limits(8), STALL);
    let now = Instant::now();
    let a = registry.admit(now).unwrap().id;
    let b = registry.admit(now).unwrap().id;
    registry.request_started(a);
    assert_eq!(registry.shed_longest_waiting(), Some(b));
    assert_eq!(registry.shed_longest_waiting(), None, "only busy ones left");
    assert_eq!(registry.phase(a), Some(Phase::Busy(1)));
}

#[test]
fn a_connection_stalls_only_while_every_answer_waits_for_the_peer() {
    let mut registry = Registry::new(&limits(4), STALL);
    let t0 = Instant::now();
    let id = registry.admit(t0).unwrap().id;
    let a = registry.request_started(id);
    let b = registry.request_started(id);
    assert_eq!(registry.watch(id), Watch::Busy, "both answers still compute");
    a.owe(t0);
    assert_eq!(registry.watch(id), Watch::Busy, "one answer computes: not stalled");
    let t1 = t0 + Duration::from_secs(5);
    b.owe(t1);
    assert_eq!(registry.watch(id), Watch::Stalled(t1 + STALL), "from the latest to wait");
    a.settle();
    assert_eq!(registry.watch(id), Watch::Busy, "the peer took a piece");
    a.owe(t1);
    registry.request_ended(id, &b, false, t1);
    assert_eq!(registry.watch(id), Watch::Stalled(t1 + STALL), "the one left waits");
    registry.request_ended(id, &a, false, t1);
    assert_eq!(registry.watch(id), Watch::Until(t1 + Duration::from_secs(120)), "idle");
}

#[test]
fn at_the_cap_a_connection_stalled_a_second_goes_before_idle_ones_and_busy_ones_stay() {
    let mut registry = Registry::new(&limits(3), STALL);
    let t0 = Instant::now();
    let idle = registry.admit(t0).unwrap().id;
    let busy = registry.admit(t0).unwrap().id;
    let stalled = registry.admit(t0).unwrap().id;
    let _computing = registry.request_started(busy);
    let owed = registry.request_started(stalled);
    owed.owe(t0);
    let early = t0 + Duration::from_millis(500);
    let next = registry.admit(early).unwrap();
    assert_eq!(next.shed, Some(idle), "stalled for half a second: the idle one goes");
    let later = t0 + Duration::from_secs(2);
    let next = registry.admit(later).unwrap();
    assert_eq!(next.shed, Some(stalled), "stalled for 2 s: it goes before the new idle one");
    assert_eq!(registry.phase(busy), Some(Phase::Busy(1)), "a computing answer is never shed");
}

#[test]
fn keyless_calls_count_while_they_run_and_refusals_close_the_connection() {
    let mut registry = Registry::new(&limits(4), STALL);
    let now = Instant::now();
    let id = registry.admit(now).unwrap().id;
    let first = registry.request_started(id);
    assert_eq!(registry.gate(id, CallClass::Keyless), Gate::Pass);
    assert_eq!(registry.gate(id, CallClass::Keyless), Gate::Pass);
    assert_eq!(registry.gate(id, CallClass::Keyless), Gate::TooManyKeyless, "2 run");
    registry.request_ended(id, &first, true, now);
    assert_eq!(registry.gate(id, CallClass::Keyless), Gate::Pass, "one ended");
    assert_eq!(registry.gate(id, CallClass::Keyed), Gate::Pass, "keyed calls are not bound");
    assert_eq!(registry.gate(id, CallClass::Refused), Gate::Refuse, "2nd refusal");
    assert_eq!(registry.gate(id, CallClass::Refused), Gate::Refuse, "3rd refusal");
    assert_eq!(registry.gate(id, CallClass::Refused), Gate::Close, "the 4th closes");
    assert_eq!(registry.watch(id), Watch::Gone, "shed");
}
