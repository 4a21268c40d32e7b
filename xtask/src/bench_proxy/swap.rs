//! The model swap of `cargo xtask bench proxy`: its timings and phases, and the raw
//! reference (a `llama-server` stopped and started by hand from Hangar's own command line).

use super::*;

/// The swap times: `[A → B, B → A]` through Hangar and by hand.
pub(super) struct Swaps {
    pub(super) hangar: [Vec<Swap>; 2],
    pub(super) raw: [Vec<Swap>; 2],
    pub(super) command_a: String,
    pub(super) command_b: String,
}

/// One swap.
pub(super) struct Swap {
    /// When it began (Hangar's: to find its phases in the model logs).
    pub(super) wall: Option<SystemTime>,
    /// Begin → the new engine is ready (Hangar: the load request answered).
    pub(super) total: Duration,
    /// Begin → the old engine has exited.
    pub(super) stopped: Option<Duration>,
    /// Begin → the new engine's process is spawned.
    pub(super) spawned: Option<Duration>,
}

impl Swap {
    /// Finds the old engine's exit and the new engine's start in the logs (millisecond
    /// timestamps) within this swap's time span.
    pub(super) fn place(&mut self, old: &[(i64, bool)], new: &[(i64, bool)]) {
        let Some(begin) = self.wall.and_then(|w| w.duration_since(UNIX_EPOCH).ok()) else {
            return;
        };
        let begin = (begin.as_millis() % DAY_MS as u128) as i64;
        let end = begin + self.total.as_millis() as i64 + 1;
        let within = |events: &[(i64, bool)], start: bool| {
            events
                .iter()
                .find(|(at, is_start)| *is_start == start && (begin - 1..=end).contains(at))
                .map(|(at, _)| Duration::from_millis((at - begin).max(0) as u64))
        };
        self.stopped = within(old, false);
        self.spawned = within(new, true);
    }
}

/// Milliseconds in a day.
pub(super) const DAY_MS: i64 = 86_400_000;

/// Milliseconds of the UTC day of an RFC 3339 timestamp (`2026-11-23T00:54:53.433Z`).
pub(super) fn day_ms(timestamp: &str) -> Option<i64> {
    let time = timestamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some((h * 3600 + m * 60) * 1000 + (s * 1000.0).round() as i64)
}

/// A `llama-server` started by hand from Hangar's command line. Killed on drop.
pub(super) struct Raw {
    pub(super) child: Child,
    pub(super) port: u16,
    /// A shell blocked reading its stdin that sends SIGTERM to `child` when a line comes: a
    /// signal without spawning `kill` inside the timed swap (xtask has no `unsafe` to call
    /// `kill(2)` itself).
    pub(super) trigger: Option<(Child, ChildStdin)>,
}

impl Raw {
    /// Spawns `argv` with its `--port` replaced by a free one, output to `<work>/<log>`.
    pub(super) fn start(argv: &[String], work: &Path, log: &str) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut args = argv[1..].to_vec();
        if let Some(i) = args.iter().position(|a| a == "--port") {
            args[i + 1] = port.to_string();
        }
        let log = work.join(log);
        let out = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&argv[0])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", argv[0]))?;
        Ok(Self { child, port, trigger: None })
    }

    pub(super) fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/health", self.port)
    }

    pub(super) fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|s| s.to_string())
    }

    /// Starts the SIGTERM trigger (outside the timed part).
    pub(super) fn arm(&mut self) -> Result<()> {
        let script = format!("read line && kill -TERM {}", self.child.id());
        let mut shell = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .context("cannot start sh")?;
        let stdin = shell.stdin.take().context("no stdin")?;
        self.trigger = Some((shell, stdin));
        Ok(())
    }

    /// SIGTERM (through the armed trigger) and wait for the exit.
    pub(super) fn terminate(&mut self) -> Result<()> {
        let (shell, mut stdin) = self.trigger.take().context("the SIGTERM trigger is not armed")?;
        stdin.write_all(b"\n")?;
        drop(stdin);
        self.child.wait()?;
        let mut shell = shell;
        shell.wait()?;
        Ok(())
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((mut shell, stdin)) = self.trigger.take() {
            drop(stdin);
            let _ = shell.wait();
        }
    }
}
