//! The one supervisor of every engine process: spawn in its own process group with death
//! tied to Hangar's, output captured line by line, exit watched, stop with SIGTERM then
//! SIGKILL of the whole group. No zombies: a thread per child waits for it.

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hangar_backend::{LogStream, ModelLogs};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::{Notify, oneshot, watch};

use crate::launch::Launch;
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
pub struct Spawner(Mutex<std_mpsc::Sender<SpawnJob>>);

impl Spawner {
    /// Starts the spawner thread.
    pub fn new() -> Arc<Self> {
        let (tx, rx) = std_mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("hangar-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("the spawner thread starts");
        Arc::new(Self(Mutex::new(tx)))
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
        let plan = Plan::new(&launch.program, &launch.args, &env)?;
        let (tx, rx) = oneshot::channel();
        let job: SpawnJob = Box::new(move || {
            let _ = tx.send(crate::spawn::spawn(&plan));
        });
        self.0
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
        std::thread::Builder::new().name(format!("wait-{pid}")).spawn(move || {
            let status = loop {
                match waitpid(pid, None) {
                    Err(Errno::EINTR) => {}
                    other => break other,
                }
            };
            // The output readers end at the pipes' EOF: join them so the last lines are in
            // the log before the exit is announced.
            for reader in readers {
                let _ = reader.join();
            }
            let status = status.map_or_else(|e| format!("wait failed: {e}"), describe);
            logs_for_exit.push(replica, LogStream::Hangar, format!("pid {pid} {status}"));
            let _ = exit_tx.send(Some(status));
        })?;
        Ok(Child { pid, exit: exit_rx, ready_hint, logs: logs.clone(), replica })
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
                while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
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
                    self.logs.push(self.replica, stream, line);
                    buf.clear();
                }
            })
            .expect("an output reader thread starts")
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
    exit: watch::Receiver<Option<String>>,
    /// Notified when the child prints a line that says it listens.
    pub(crate) ready_hint: Arc<Notify>,
    logs: ModelLogs,
    replica: u32,
}

impl Child {
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
    /// has been reaped. Stragglers of the group get SIGKILL too.
    pub async fn stop(&self, grace: Duration) {
        if self.exited().is_none() {
            let _ = killpg(self.pid, Signal::SIGTERM);
            if self.wait_for(grace).await.is_none() {
                self.logs.push(
                    self.replica,
                    LogStream::Hangar,
                    format!("pid {} ignored SIGTERM for {grace:?}: SIGKILL", self.pid),
                );
                let _ = killpg(self.pid, Signal::SIGKILL);
                self.wait().await;
            }
        }
        let _ = killpg(self.pid, Signal::SIGKILL);
    }

    /// The child's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }
}

impl Drop for Child {
    /// A child whose runtime is dropped without `unload` does not outlive it.
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
    }
}
