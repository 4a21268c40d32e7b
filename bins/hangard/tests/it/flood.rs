//! Connection floods against the real `hangard serve`, on loopback only: thousands of
//! half-open connections must neither stop a new client from being served nor pin a core,
//! and hangard holds at most `connections.max_connections` of them; running out of
//! descriptors (EMFILE) must pause the accept loop, not spin it.
//!
//! CPU time and memory come from `/proc/<pid>/stat` and `/proc/<pid>/status`. The bounds
//! are far from what the server needs (a busy loop burns a whole core; an idle server next
//! to nothing), so a loaded machine does not make them flaky. Waits for the server are
//! bounded by [`LIVENESS`]; the two-second windows are measurement windows.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use serde_json::json;

use crate::support::Server;

/// How long a test waits for the server to do what it must; not a performance claim.
const LIVENESS: Duration = Duration::from_secs(10);
/// Clock ticks per second in `/proc/<pid>/stat` (Linux's USER_HZ).
const TICKS_PER_S: f64 = 100.0;
/// The share of one core that counts as spinning: a busy accept loop takes all of it.
const SPINNING: f64 = 0.25;
/// One flood at a time: each measures its own server's CPU time on a shared machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// Raises this process's soft descriptor limit to its hard one (hangard, started after,
/// inherits it and raises its own too); the limit now.
fn raise_own_limit() -> u64 {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let wanted = hard.min(1 << 20);
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).unwrap();
    }
    getrlimit(Resource::RLIMIT_NOFILE).unwrap().0
}

fn addr(server: &Server) -> SocketAddr {
    server.base.trim_start_matches("http://").parse().unwrap()
}

/// `count` connections that each sent half a request line and nothing more. The server
/// may close some of them (that is what the cap does); they are held all the same.
fn half_open(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, LIVENESS) {
            Ok(mut stream) => {
                let _ = stream.write_all(b"GET /healthz HT");
                held.push(stream);
            }
            Err(_) => failed += 1,
        }
    }
    assert!(failed * 10 <= count, "{failed} of {count} connections could not be opened");
    held
}

/// `GET /healthz` on a new connection: the whole answer, or why there was none.
fn healthz(addr: SocketAddr) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&addr, LIVENESS).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(LIVENESS)).map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer)
}

/// Polls `probe` until it gives a value, failing with `what` after [`LIVENESS`].
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIVENESS;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what} within {LIVENESS:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// User plus system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses: state is field 3, utime 14,
    // stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The share of one core `pid` used over a two-second window.
fn cpu_share(pid: u32) -> f64 {
    let window = Duration::from_secs(2);
    let (before, start) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(window);
    let (after, elapsed) = (cpu_ticks(pid), start.elapsed());
    (after - before) as f64 / TICKS_PER_S / elapsed.as_secs_f64()
}

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Descriptors `pid` has open, and how many of them are sockets (one closed while it is
/// read is not counted).
fn descriptors(pid: u32) -> (usize, usize) {
    let mut all = 0;
    let mut sockets = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        all += 1;
        sockets += usize::from(target.to_string_lossy().starts_with("socket:"));
    }
    (all, sockets)
}

#[test]
fn a_flood_of_half_open_connections_neither_starves_new_clients_nor_burns_a_core() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let limit = raise_own_limit();
    // Leave this process room for the client below, the test harness and the other tests
    // of this binary, which share the process and its descriptor limit.
    let count = usize::try_from(limit.saturating_sub(1024)).unwrap_or(usize::MAX).min(4000);
    assert!(count >= 2000, "needs a descriptor limit of at least 3024 (hard limit {limit})");
    let cap = count / 4;
    let server = Server::start(
        &json!({
            // Timeouts far beyond the test: the flood stays half-open, only the cap acts.
            "connections": {
                "max_connections": cap,
                "header_read_timeout_s": 600,
                "idle_timeout_s": 600
            }
        }),
        &[],
    );
    let (pid, addr) = (server.pid(), addr(&server));
    let rss_before = rss_kib(pid);

    let opening = Instant::now();
    let held = half_open(addr, count);
    let opened_in = opening.elapsed();

    let asked = Instant::now();
    let answer = healthz(addr).unwrap_or_else(|e| panic!("a new client was not served: {e}"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answered_in = asked.elapsed();

    // The flood beyond the cap was shed: hangard holds at most `cap` connections.
    let (fds, sockets) = wait_for("hangard holds at most max_connections sockets", || {
        let (fds, sockets) = descriptors(pid);
        (sockets <= cap + 16).then_some((fds, sockets))
    });

    let idle_share = cpu_share(pid);
    let rss_after = rss_kib(pid);
    eprintln!(
        "flood: {} connections held by the client (opened in {opened_in:?}), cap {cap}; \
         hangard: {sockets} sockets ({fds} descriptors), /healthz answered in \
         {answered_in:?}, {:.1} % of a core while the flood sits idle, RSS {} MiB -> {} MiB",
        held.len(),
        idle_share * 100.0,
        rss_before / 1024,
        rss_after / 1024,
    );
    assert!(idle_share < SPINNING, "{:.0} % of a core with an idle flood", idle_share * 100.0);
    // Each held connection costs hyper's read buffer and its task (about 10 to 20 KiB):
    // `cap` of them stay well under 64 KiB each.
    let bound = rss_before + 64 * cap as u64;
    assert!(rss_after < bound, "RSS {rss_after} KiB, over {bound} KiB");
    drop(held);
}

#[test]
fn out_of_descriptors_the_accept_loop_pauses_instead_of_spinning() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    raise_own_limit();
    let server = Server::start(
        &json!({ "connections": { "header_read_timeout_s": 600, "idle_timeout_s": 600 } }),
        &[],
    );
    let (pid, addr) = (server.pid(), addr(&server));
    // Room for a few dozen connections, set on the running server.
    let limit = descriptors(pid).0 + 32;
    let status = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={limit}:")])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit failed");

    // Room for 32 more and 64 beyond it: fewer than the listen backlog (128, as std's), so
    // every connect completes in the kernel whether hangard accepts or not.
    let held = half_open(addr, 96);
    wait_for("hangard runs out of descriptors (EMFILE in its log)", || {
        server.logs().contains("Too many open files").then_some(())
    });
    let share = cpu_share(pid);
    eprintln!("EMFILE: limit {limit}, {:.1} % of a core while accept fails", share * 100.0);
    assert!(share < SPINNING, "{:.0} % of a core: the accept loop spins", share * 100.0);

    // The flood ends: new clients are served again.
    drop(held);
    wait_for("a new client is served once the flood is gone", || {
        healthz(addr).ok().filter(|answer| answer.starts_with("HTTP/1.1 200"))
    });
}
