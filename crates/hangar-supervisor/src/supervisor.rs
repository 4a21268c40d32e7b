//! The one supervisor of every engine process: spawn in its own process group with death
//! tied to Hangar's, output captured line by line, exit watched, stop with SIGTERM then
//! SIGKILL of the whole group. No zombies: a thread per child waits for it.
//!
//! A group is signalled only while its leader is unreaped: the waiting thread first sees
//! the exit without reaping (`waitid` with `WNOWAIT`), kills what is left of the group while
//! the zombie leader still holds its pid (so the id cannot name another process), then
//! reaps it under the same lock every signal takes. No `killpg` can race with pid reuse.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hangar_backend::{LogStream, ModelLogs};
use hangar_config::ChildEnv;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use tokio::sync::{Notify, oneshot, watch};

use crate::command::Launch;
use crate::spawn::{Plan, Spawned};

/// Lines of output a crash or failed load quotes.
const QUOTED_LINES: usize = 12;

/// Output markers after which an engine is worth polling at once: llama-server's and
/// uvicorn's (vLLM's) "listening" lines.
const READY_MARKERS: &[&str] =
    &["listening on", "Uvicorn running on", "Application startup complete"];

type SpawnJob = Box<dyn FnOnce() + Send>;

/// The thread children are started from. A child's death signal fires when the thread that
/// spawned it ends, so children are spawned from this one long-lived thread, which ends only
/// when the last backend or runtime holding it is gone (Hangar exits: every child dies).
pub struct Spawner {
    jobs: Mutex<std_mpsc::Sender<SpawnJob>>,
    /// Which of Hangar's environment variables the children get.
    inherit: ChildEnv,
}

impl Spawner {
    /// Starts the spawner thread; children get the built-in list of Hangar's variables.
    pub fn new() -> Arc<Self> {
        Self::with_env(ChildEnv::default())
    }

    /// Starts the spawner thread; children get the variables of Hangar's that `inherit`
    /// passes, never `HANGAR_*`.
    pub fn with_env(inherit: ChildEnv) -> Arc<Self> {
        let (tx, rx) = std_mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("hangar-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("the spawner thread starts");
        Arc::new(Self { jobs: Mutex::new(tx), inherit })
    }

    /// Starts `launch` as replica `replica` of `model`: its own process group, SIGKILL when
    /// Hangar dies, stdin closed, stdout and stderr into `logs` and `tracing`.
    ///
    /// # Errors
    /// The OS error of the spawn.
    pub async fn spawn(
        self: &Arc<Self>,
        launch: &Launch,
        model: &str,
        replica: u32,
        logs: &ModelLogs,
    ) -> std::io::Result<Child> {
        let mut env = launch.env.clone();
        if let Some(lib) = &launch.library_path {
            let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
            let joined = if old.is_empty() { lib.clone() } else { format!("{lib}:{old}") };
            env.push(("LD_LIBRARY_PATH".to_owned(), joined));
        }
        let plan = Plan::new(&launch.program, &launch.args, &env, &self.inherit, &launch.pass_env)?;
        let (tx, rx) = oneshot::channel();
        let job: SpawnJob = Box::new(move || {
            let _ = tx.send(crate::spawn::spawn(&plan));
        });
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job)
            .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
        let Spawned { pid, stdout, stderr } =
            rx.await.map_err(|_| std::io::Error::other("the spawner dropped a spawn"))??;
        let pid = Pid::from_raw(pid);
        logs.push(
            replica,
            LogStream::Hangar,
            format!("started pid {pid}: {}", launch.command_line()),
        );
        let ready_hint = Arc::new(Notify::new());
        let output = Output {
            replica,
            logs: logs.clone(),
            ready_hint: Arc::clone(&ready_hint),
            listening: Arc::new(AtomicBool::new(false)),
            span: tracing::info_span!("engine", model, replica, pid = pid.as_raw()),
        };
        let readers = [
            output.clone().read(stdout, LogStream::Stdout),
            output.read(stderr, LogStream::Stderr),
        ];
        let (exit_tx, exit_rx) = watch::channel(None);
        let logs_for_exit = logs.clone();
        let group = Arc::new(Group { pid, reaped: Mutex::new(false) });
        let reaper = Arc::clone(&group);
        std::thread::Builder::new().name(format!("wait-{pid}")).spawn(move || {
            let status = reaper.wait_and_reap();
            // The output readers end at the pipes' EOF: join them so the last lines are in
            // the log before the exit is announced.
            for reader in readers {
                let _ = reader.join();
            }
            let status = status.map_or_else(|e| format!("wait failed: {e}"), describe);
            logs_for_exit.push(replica, LogStream::Hangar, format!("pid {pid} {status}"));
            let _ = exit_tx.send(Some(status));
        })?;
        Ok(Child { pid, group, exit: exit_rx, ready_hint, logs: logs.clone(), replica })
    }

    /// The environment a child of this spawner gets for a model whose own `pass_env` is
    /// `own`, with `env` set over it (for a helper process started another way, such as a
    /// bridge's package check).
    pub fn environment(
        &self,
        own: &[String],
        env: &[(String, String)],
    ) -> Vec<(OsString, OsString)> {
        crate::spawn::environment(&self.inherit, own, env)
    }
}

/// A child's process group, signalled only while its leader is unreaped.
struct Group {
    pid: Pid,
    /// Set, under this lock, when the leader has been reaped: from then on its pid may
    /// name another process, and the group is never signalled again.
    reaped: Mutex<bool>,
}

impl Group {
    /// Sends `signal` to the group unless its leader has been reaped; whether it was sent.
    fn signal(&self, signal: Signal) -> bool {
        let reaped = self.reaped.lock().unwrap_or_else(PoisonError::into_inner);
        !*reaped && killpg(self.pid, signal).is_ok()
    }

    /// Waits for the leader's exit without reaping it, kills the rest of its group (the
    /// zombie leader keeps the group's id from being reused), then reaps it.
    fn wait_and_reap(&self) -> nix::Result<WaitStatus> {
        let seen = loop {
            match waitid(Id::Pid(self.pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(Errno::EINTR) => {}
                other => break other,
            }
        };
        let mut reaped = self.reaped.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.is_ok() {
            // Stragglers (an engine's own workers) die with their leader.
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
        let status = loop {
            match waitpid(self.pid, None) {
                Err(Errno::EINTR) => {}
                other => break other,
            }
        };
        *reaped = true;
        status
    }
}

/// Where one child's output lines go.
#[derive(Clone)]
struct Output {
    replica: u32,
    logs: ModelLogs,
    ready_hint: Arc<Notify>,
    /// Set once the engine printed one of [`READY_MARKERS`] (on either stream).
    listening: Arc<AtomicBool>,
    span: tracing::Span,
}

impl Output {
    /// Reads `pipe` line by line into the log and `tracing` until EOF, on a thread of its own.
    ///
    /// Lines go to `tracing` (target `hangar::engine`) at INFO until the engine says it
    /// listens — start-up output explains a failed load — and at DEBUG after that:
    /// `llama-server` prints about ten lines per request, and formatting them cost `hangard`
    /// more CPU than forwarding the request. Every line is kept in the model's log either way.
    fn read(
        self,
        pipe: impl Read + Send + 'static,
        stream: LogStream,
    ) -> std::thread::JoinHandle<()> {
        let name = format!("{}-{}", <&str>::from(stream), self.replica);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _entered = self.span.enter();
                let stream_name = <&str>::from(stream);
                let mut reader = BufReader::new(pipe);
                let mut buf = Vec::new();
                let max = self.logs.max_line_bytes();
                while let Ok((n, dropped)) = read_line_within(&mut reader, &mut buf, max)
                    && n > 0
                {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']);
                    if self.listening.load(Ordering::Relaxed) {
                        tracing::debug!(target: "hangar::engine", stream = stream_name, "{line}");
                    } else {
                        tracing::info!(target: "hangar::engine", stream = stream_name, "{line}");
                        if READY_MARKERS.iter().any(|m| line.contains(m)) {
                            self.listening.store(true, Ordering::Relaxed);
                            self.ready_hint.notify_one();
                        }
                    }
                    self.logs.push_cut(self.replica, stream, line, dropped);
                    buf.clear();
                }
            })
            .expect("an output reader thread starts")
    }
}

/// Reads one line of `reader` into `buf`, keeping at most `max` bytes of it: the bytes read
/// in all (0 at the end) and how many bytes of its text were dropped. A line of any length never
/// takes more than `max` bytes of memory.
fn read_line_within(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<(usize, usize)> {
    let (mut read, mut dropped) = (0, 0);
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((read, dropped));
        }
        let end = available.iter().position(|&b| b == b'\n').map(|i| i + 1);
        let chunk = &available[..end.unwrap_or(available.len())];
        let keep = chunk.len().min(max.saturating_sub(buf.len()));
        buf.extend_from_slice(&chunk[..keep]);
        // Dropped text, not counting a dropped line ending.
        dropped += chunk.len() - keep - usize::from(end.is_some() && keep < chunk.len());
        let n = chunk.len();
        reader.consume(n);
        read += n;
        if end.is_some() {
            return Ok((read, dropped));
        }
    }
}

/// "exited with status 3" / "was killed by signal 9 (SIGKILL)".
fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exited with status {code}"),
        WaitStatus::Signaled(_, signal, _) => {
            format!("was killed by signal {} ({signal})", signal as i32)
        }
        other => format!("ended ({other:?})"),
    }
}

/// A running (or ended) engine process.
pub struct Child {
    pid: Pid,
    group: Arc<Group>,
    exit: watch::Receiver<Option<String>>,
    /// Notified when the child prints a line that says it listens.
    ready_hint: Arc<Notify>,
    logs: ModelLogs,
    replica: u32,
}

impl Child {
    /// Resolves when the child prints a line that says it listens (a hint to check its
    /// health route now rather than at the next poll).
    pub fn says_it_listens(&self) -> tokio::sync::futures::Notified<'_> {
        self.ready_hint.notified()
    }

    /// How the child ended, once it has.
    pub fn exited(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Waits until the child has ended; how it ended.
    pub async fn wait(&self) -> String {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(status) => status.clone().unwrap_or_default(),
            Err(_) => "ended".to_owned(),
        }
    }

    /// Waits at most `limit` for the child to end.
    pub async fn wait_for(&self, limit: Duration) -> Option<String> {
        tokio::time::timeout(limit, self.wait()).await.ok()
    }

    /// `"<how it ended>; last output:\n<lines>"`, for `last_error`.
    pub fn obituary(&self, status: &str) -> String {
        let lines: Vec<String> = self
            .logs
            .tail(QUOTED_LINES * 4)
            .into_iter()
            .filter(|l| l.replica == self.replica && l.stream != LogStream::Hangar)
            .map(|l| l.line)
            .collect();
        let last = &lines[lines.len().saturating_sub(QUOTED_LINES)..];
        if last.is_empty() {
            format!("process {status}; it printed nothing")
        } else {
            format!("process {status}; last output:\n{}", last.join("\n"))
        }
    }

    /// SIGTERM to the child's process group, SIGKILL after `grace`; returns once the child
    /// has been reaped. Stragglers of the group get SIGKILL when the leader exits.
    pub async fn stop(&self, grace: Duration) {
        if self.exited().is_none() {
            self.group.signal(Signal::SIGTERM);
            if self.wait_for(grace).await.is_none() {
                self.logs.push(
                    self.replica,
                    LogStream::Hangar,
                    format!("pid {} ignored SIGTERM for {grace:?}: SIGKILL", self.pid),
                );
                self.group.signal(Signal::SIGKILL);
            }
        }
        self.wait().await;
    }

    /// The child's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }
}

impl Drop for Child {
    /// A child whose runtime is dropped without `unload` does not outlive it.
    fn drop(&mut self) {
        self.group.signal(Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Launch;

    fn shell(script: &str) -> Launch {
        Launch {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            pass_env: Vec::new(),
            library_path: None,
            host: "127.0.0.1".into(),
            port: 0,
            socket: None,
            api_key: None,
        }
    }

    /// Whether `pid` runs (a zombie waiting for a reaper that is not us does not).
    fn running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stragglers_die_with_their_leader_and_a_reaped_group_is_never_signalled() {
        let spawner = Spawner::new();
        let logs = ModelLogs::default();
        // The leader starts a sleeper in its group, prints its pid and exits on its own.
        let child = spawner.spawn(&shell("sleep 300 & echo $!; exit 0"), "m", 0, &logs).await;
        let child = child.unwrap();
        let status = child.wait_for(Duration::from_secs(20)).await.expect("the leader exits");
        assert_eq!(status, "exited with status 0");
        let straggler: i32 = logs
            .tail(10)
            .iter()
            .find(|l| l.stream == LogStream::Stdout)
            .and_then(|l| l.line.parse().ok())
            .expect("the sleeper's pid");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while running(straggler) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(straggler), "pid {straggler} outlived its group's leader");
        // The leader is reaped: its pid may be another process's now, so nothing is sent.
        assert!(!child.group.signal(Signal::SIGKILL));
        child.stop(Duration::from_millis(100)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_printing_one_line_of_50_mb_leaves_its_log_within_bounds() {
        let spawner = Spawner::new();
        // Bounds as `limits.max_log_line_bytes` and `limits.max_log_bytes` set them.
        let (kept, max_bytes) = (1_000, 3_000);
        let bounds = hangar_backend::LogBounds { max_line_bytes: kept, max_bytes };
        let logs = ModelLogs::bounded(bounds);
        let script = "head -c 50000000 /dev/zero | tr '\\0' a; echo; echo after";
        let child = spawner.spawn(&shell(script), "m", 0, &logs).await.unwrap();
        child.wait_for(Duration::from_secs(60)).await.expect("the child exits");
        // Its output readers finish after it exits: wait for the last line.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !logs.tail(10).iter().any(|l| l.line == "after") {
            assert!(std::time::Instant::now() < deadline, "no `after` line");
            std::thread::sleep(Duration::from_millis(20));
        }
        let lines: Vec<_> =
            logs.tail(10).into_iter().filter(|l| l.stream == LogStream::Stdout).collect();
        let cut = &lines[0].line;
        assert_eq!(&cut[..kept], "a".repeat(kept), "the line's head is kept");
        assert!(
            cut.ends_with(&format!("[{} more bytes cut]", 50_000_000 - kept)),
            "{}",
            &cut[kept..]
        );
        let bytes: usize = logs.tail(usize::MAX).iter().map(|l| l.line.len()).sum();
        assert!(bytes <= max_bytes, "{bytes} bytes kept");
        child.stop(Duration::from_millis(100)).await;
    }

    #[test]
    fn a_line_is_read_within_its_bound_whatever_its_length() {
        let text = b"short\nlonger than eight\nlast";
        let mut reader = std::io::BufReader::with_capacity(4, &text[..]);
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        loop {
            buf.clear();
            let (n, dropped) = read_line_within(&mut reader, &mut buf, 8).unwrap();
            if n == 0 {
                break;
            }
            lines.push((String::from_utf8_lossy(&buf).into_owned(), n, dropped));
        }
        let expect = [
            ("short\n".to_owned(), 6, 0),
            ("longer t".to_owned(), 18, 9),
            ("last".to_owned(), 4, 0),
        ];
        assert_eq!(lines, expect);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_group_is_signalled_and_stop_reaps_it() {
        let spawner = Spawner::new();
        let logs = ModelLogs::default();
        let child = spawner.spawn(&shell("exec sleep 300"), "m", 0, &logs).await.unwrap();
        assert!(running(child.pid()));
        child.stop(Duration::from_secs(5)).await;
        assert_eq!(child.exited().as_deref(), Some("was killed by signal 15 (SIGTERM)"));
        assert!(!child.group.signal(Signal::SIGTERM));
    }
}
