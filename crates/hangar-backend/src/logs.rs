//! [`ModelLogs`]: the bounded, followable log of a model's engine (a child process's
//! output lines, or whatever an in-process engine chooses to report).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::broadcast;

/// Lines a model's log keeps; older lines are dropped first.
pub const LOG_CAPACITY: usize = 2_000;

/// Default bytes of text a model's log keeps, all lines together
/// (`limits.max_log_bytes`); older lines are dropped first.
pub const LOG_MAX_BYTES: usize = hangar_config::DEFAULT_MAX_LOG_BYTES as usize;

/// Default longest line kept, in bytes (`limits.max_log_line_bytes`): the rest of a longer
/// one is dropped and the line marked (a child's output readers cut lines as they read
/// them, before they are whole in memory).
pub const LOG_MAX_LINE_BYTES: usize = hangar_config::DEFAULT_MAX_LOG_LINE_BYTES as usize;

/// What a model's log keeps: its longest line and all its lines' bytes together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBounds {
    /// Longest line kept, in bytes; a longer one is cut and marked.
    pub max_line_bytes: usize,
    /// Bytes of text kept, all lines together; older lines are dropped first.
    pub max_bytes: usize,
}

impl Default for LogBounds {
    fn default() -> Self {
        Self { max_line_bytes: LOG_MAX_LINE_BYTES, max_bytes: LOG_MAX_BYTES }
    }
}

/// `line` cut to `max` bytes on a char boundary, marked with how much was cut (`dropped`
/// bytes were already left out by the reader).
pub fn cut_line(line: &str, dropped: usize, max: usize) -> String {
    if line.len() <= max && dropped == 0 {
        return line.to_owned();
    }
    let mut end = line.len().min(max);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let cut = line.len() - end + dropped;
    format!("{} … [{cut} more bytes cut]", &line[..end])
}

/// Which output a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum LogStream {
    /// The engine's standard output.
    Stdout,
    /// The engine's standard error.
    Stderr,
    /// Hangar itself (the command line it started, exit statuses, …).
    Hangar,
}

/// One line of a model's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLine {
    /// When the line was read, RFC 3339 with milliseconds (UTC).
    pub timestamp: String,
    /// The replica whose engine wrote it.
    pub replica: u32,
    /// Where it came from.
    pub stream: LogStream,
    /// The text, without its line ending.
    pub line: String,
}

/// The log of one model: the last [`LOG_CAPACITY`] lines of all its replicas, across
/// loads, within its [`LogBounds`], plus a live feed for followers. Cheap to clone (shared).
///
/// A model that never logs costs one small allocation: the lines grow as they come, and the
/// live feed (a channel of [`LIVE_CAPACITY`] slots) exists only while someone follows; it
/// is released at the first line after the last follower left.
#[derive(Clone, Default)]
pub struct ModelLogs(Arc<Mutex<Log>>);

/// Lines a follower may fall behind before it misses some.
pub(crate) const LIVE_CAPACITY: usize = 256;

#[derive(Default)]
struct Log {
    lines: VecDeque<LogLine>,
    /// Bytes of text in `lines`.
    bytes: usize,
    bounds: LogBounds,
    /// The live feed, while anyone follows.
    live: Option<broadcast::Sender<LogLine>>,
}

impl ModelLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An empty log within `bounds` (a default one is within [`LogBounds::default`]).
    pub fn bounded(bounds: LogBounds) -> Self {
        Self(Arc::new(Mutex::new(Log { bounds, ..Log::default() })))
    }

    /// The longest line this log keeps, in bytes: what a reader of a child's output needs
    /// to hold of one.
    pub fn max_line_bytes(&self) -> usize {
        self.lock().bounds.max_line_bytes
    }

    /// Appends a line stamped now (cut to the longest line kept), dropping the oldest
    /// while the log holds [`LOG_CAPACITY`] lines or its bytes bound, and sends it to
    /// followers.
    pub fn push(&self, replica: u32, stream: LogStream, line: impl Into<String>) {
        let text: String = line.into();
        let max = self.max_line_bytes();
        let text = if text.len() > max { cut_line(&text, 0, max) } else { text };
        self.append(replica, stream, text);
    }

    /// Appends `line`, of which a reader already left `dropped` bytes out, cut and marked
    /// as [`Self::push`] does.
    pub fn push_cut(&self, replica: u32, stream: LogStream, line: &str, dropped: usize) {
        self.append(replica, stream, cut_line(line, dropped, self.max_line_bytes()));
    }

    fn append(&self, replica: u32, stream: LogStream, text: String) {
        let timestamp = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let line = LogLine { timestamp, replica, stream, line: text };
        let mut log = self.lock();
        let max_bytes = log.bounds.max_bytes;
        while log.lines.len() == LOG_CAPACITY
            || (!log.lines.is_empty() && log.bytes + line.line.len() > max_bytes)
        {
            let Some(old) = log.lines.pop_front() else { break };
            log.bytes -= old.line.len();
        }
        log.bytes += line.line.len();
        if let Some(live) = &log.live {
            match live.receiver_count() {
                0 => log.live = None,
                _ => drop(live.send(line.clone())),
            }
        }
        log.lines.push_back(line);
    }

    /// Whether a live feed is allocated (someone follows, or followed since the last line).
    pub fn is_followed(&self) -> bool {
        self.lock().live.is_some()
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> Vec<LogLine> {
        let log = self.lock();
        let lines = &log.lines;
        lines.iter().skip(lines.len().saturating_sub(n)).cloned().collect()
    }

    /// The last `n` lines and a receiver of every later line, taken atomically (no line is
    /// missed or repeated between the two).
    pub fn follow(&self, n: usize) -> (Vec<LogLine>, broadcast::Receiver<LogLine>) {
        let mut log = self.lock();
        let receiver = match &log.live {
            Some(live) => live.subscribe(),
            None => {
                let (live, receiver) = broadcast::channel(LIVE_CAPACITY);
                log.live = Some(live);
                receiver
            }
        };
        let lines = &log.lines;
        let tail = lines.iter().skip(lines.len().saturating_sub(n)).cloned().collect();
        (tail, receiver)
    }
}

impl std::fmt::Debug for ModelLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.lock().lines.len();
        f.debug_struct("ModelLogs").field("lines", &len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_newest_lines_within_capacity() {
        let logs = ModelLogs::default();
        for i in 0..LOG_CAPACITY + 5 {
            logs.push(0, LogStream::Stdout, format!("line {i}"));
        }
        let all = logs.tail(usize::MAX);
        assert_eq!(all.len(), LOG_CAPACITY);
        assert_eq!(all[0].line, "line 5");
        let last = logs.tail(2);
        let texts: Vec<_> = last.iter().map(|l| l.line.as_str()).collect();
        assert_eq!(
            texts,
            [format!("line {}", LOG_CAPACITY + 3), format!("line {}", LOG_CAPACITY + 4)]
        );
    }

    #[test]
    fn the_log_stays_within_its_byte_bound_and_long_lines_are_cut_and_marked() {
        let logs = ModelLogs::default();
        let long = "x".repeat(LOG_MAX_LINE_BYTES + 100);
        // 300 lines of 16 KiB cross the 4 MiB bound well before the line count.
        for _ in 0..300 {
            logs.push(0, LogStream::Stdout, long.clone());
        }
        let all = logs.tail(usize::MAX);
        let bytes: usize = all.iter().map(|l| l.line.len()).sum();
        assert!(bytes <= LOG_MAX_BYTES, "{bytes} bytes kept");
        assert!(all.len() < 300 && all.len() > 200, "{} lines kept", all.len());
        let line = &all[0].line;
        assert!(line.ends_with("… [100 more bytes cut]"), "{}", &line[line.len() - 40..]);
        assert!(line.starts_with(&"x".repeat(LOG_MAX_LINE_BYTES)));
        // A cut never splits a character.
        let wide = "é".repeat(LOG_MAX_LINE_BYTES);
        let cut = cut_line(&wide, 7, LOG_MAX_LINE_BYTES);
        assert!(
            cut.ends_with(&format!("[{} more bytes cut]", wide.len() - LOG_MAX_LINE_BYTES + 7))
        );
        assert_eq!(cut_line("short", 0, LOG_MAX_LINE_BYTES), "short");
    }

    #[test]
    fn a_log_keeps_the_bounds_it_was_given() {
        let logs = ModelLogs::bounded(LogBounds { max_line_bytes: 10, max_bytes: 25 });
        assert_eq!(logs.max_line_bytes(), 10);
        logs.push(0, LogStream::Stdout, "0123456789abc");
        assert_eq!(logs.tail(1)[0].line, "0123456789 … [3 more bytes cut]");
        for i in 0..5 {
            logs.push(0, LogStream::Stdout, format!("line {i}"));
        }
        let kept: Vec<String> = logs.tail(usize::MAX).into_iter().map(|l| l.line).collect();
        assert_eq!(kept, ["line 1", "line 2", "line 3", "line 4"], "24 bytes of at most 25");
    }

    #[tokio::test]
    async fn follow_misses_and_repeats_nothing() {
        let logs = ModelLogs::default();
        logs.push(0, LogStream::Stderr, "before");
        let (tail, mut live) = logs.follow(10);
        logs.push(1, LogStream::Stdout, "after");
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].line, "before");
        let next = live.recv().await.unwrap();
        assert_eq!((next.replica, next.line.as_str()), (1, "after"));
        assert!(live.try_recv().is_err());
    }

    #[test]
    fn the_live_feed_exists_only_while_followed() {
        let logs = ModelLogs::default();
        logs.push(0, LogStream::Stdout, "nobody follows");
        assert!(!logs.is_followed(), "pushing allocates no feed");
        let (_, first) = logs.follow(0);
        let (_, second) = logs.follow(0);
        assert!(logs.is_followed());
        drop(first);
        logs.push(0, LogStream::Stdout, "one follower left");
        assert!(logs.is_followed(), "kept while anyone follows");
        drop(second);
        logs.push(0, LogStream::Stdout, "none left");
        assert!(!logs.is_followed(), "released at the first line after the last follower");
        // Following again starts a fresh feed that gets later lines.
        let (tail, mut live) = logs.follow(1);
        assert_eq!(tail[0].line, "none left");
        logs.push(2, LogStream::Hangar, "again");
        assert_eq!(live.try_recv().unwrap().line, "again");
    }
}
