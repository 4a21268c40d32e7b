//! One worker's session: requests out through a writer task, replies in through a reader task
//! that routes them by id, liveness by ping, and one place that declares the worker dead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use crate::protocol::{Incoming, Op, Outgoing, Reply};

/// Longest line quoted when the worker writes something that is not protocol.
const QUOTED_BYTES: usize = 200;

/// A live session with one worker. Cheap to share; dies once, with a reason.
pub(crate) struct Session {
    out: mpsc::UnboundedSender<String>,
    pending: Mutex<HashMap<u64, mpsc::UnboundedSender<Reply>>>,
    next_id: AtomicU64,
    dead: watch::Sender<Option<String>>,
}

/// The next line of `reader` without its line ending; `Some(Err(()))` for one over `max`
/// bytes (not read further), `None` at the end.
async fn next_line_within<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<Result<String, ()>>> {
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            break;
        }
        let end = available.iter().position(|&b| b == b'\n');
        let take = end.map_or(available.len(), |i| i + 1);
        if line.len() + take > max + 1 {
            return Ok(Some(Err(())));
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if end.is_some() {
            break;
        }
    }
    while line.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
        line.pop();
    }
    let text = String::from_utf8(line)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(Some(Ok(text)))
}

impl Session {
    /// Starts the reader and writer tasks on `stream`, reading lines of at most `max_line`
    /// bytes: a longer one is not held, and the worker is declared dead.
    pub(crate) fn start_within(stream: UnixStream, max_line: usize) -> Arc<Self> {
        let (read, mut write) = stream.into_split();
        let (out, mut lines) = mpsc::unbounded_channel::<String>();
        let session = Arc::new(Self {
            out,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            dead: watch::Sender::new(None),
        });
        let writer = Arc::downgrade(&session);
        tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                if let Err(e) = write.write_all(line.as_bytes()).await {
                    if let Some(session) = writer.upgrade() {
                        session.die(format!("cannot write to the worker: {e}"));
                    }
                    return;
                }
            }
        });
        let reader = Arc::clone(&session);
        tokio::spawn(async move {
            let mut lines = BufReader::new(read);
            let mut dead = reader.dead.subscribe();
            loop {
                let line = tokio::select! {
                    line = next_line_within(&mut lines, max_line) => line,
                    _ = dead.wait_for(Option::is_some) => return,
                };
                match line {
                    Ok(Some(Err(()))) => {
                        let why = format!("the worker wrote a line over {max_line} bytes");
                        return reader.die(why);
                    }
                    Ok(Some(Ok(line))) => {
                        if let Err(why) = reader.route(&line) {
                            reader.die(why);
                            return;
                        }
                    }
                    Ok(None) => return reader.die("the worker closed the connection".into()),
                    Err(e) => return reader.die(format!("cannot read from the worker: {e}")),
                }
            }
        });
        session
    }

    /// Hands one line from the worker to the request it answers.
    fn route(&self, line: &str) -> Result<(), String> {
        let incoming: Incoming = serde_json::from_str(line).map_err(|e| {
            let mut end = line.len().min(QUOTED_BYTES);
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            format!("the worker wrote a line that is not protocol ({e}): {:?}", &line[..end])
        })?;
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(to) = pending.get(&incoming.id) else {
            return Err(format!(
                "the worker answered request {}, which is not in flight",
                incoming.id
            ));
        };
        let last = incoming.reply.is_final();
        // The caller may have gone away (a dropped call); its replies are dropped here.
        let _ = to.send(incoming.reply);
        if last {
            pending.remove(&incoming.id);
        }
        Ok(())
    }

    /// Sends `op` and returns the call that receives its replies.
    pub(crate) fn call(self: &Arc<Self>, op: &Op) -> Call {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let cancellable = matches!(op, Op::Generate(_));
        // Checked under the lock `die` clears under: a call either is ended by `die` or sees
        // the worker dead and never waits (its sender is dropped here).
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if self.reason().is_none() {
            pending.insert(id, tx);
            let mut line = serde_json::to_string(&Outgoing { id, op }).unwrap_or_default();
            line.push('\n');
            let _ = self.out.send(line);
        }
        drop(pending);
        Call { id, rx, session: Arc::clone(self), finished: false, cancellable }
    }

    /// Why the worker is dead, once it is.
    pub(crate) fn reason(&self) -> Option<String> {
        self.dead.borrow().clone()
    }

    /// Waits until the worker is dead; why.
    pub(crate) async fn died(&self) -> String {
        let mut dead = self.dead.subscribe();
        match dead.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the session ended".to_owned(),
        }
    }

    /// Declares the worker dead (the first reason wins) and ends every call in flight.
    pub(crate) fn die(&self, reason: String) {
        let first = self.dead.send_if_modified(|dead| {
            if dead.is_none() {
                *dead = Some(reason.clone());
                true
            } else {
                false
            }
        });
        if first {
            tracing::debug!(%reason, "bridge worker session ended");
            self.pending.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }

    /// Pings the worker every `every`; a pong not back within `deadline` kills the session.
    /// Ends when the session does.
    pub(crate) fn watch_liveness(self: &Arc<Self>, every: Duration, deadline: Duration) {
        let session = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(live) = session.upgrade() else { return };
                if live.reason().is_some() {
                    return;
                }
                let mut call = live.call(&Op::Ping);
                drop(live);
                match tokio::time::timeout(deadline, call.finish()).await {
                    Ok(Ok(Reply::Pong)) => {}
                    Ok(Ok(other)) => {
                        call.session.die(format!("the worker answered ping with {other:?}"));
                        return;
                    }
                    Ok(Err(_)) => return,
                    Err(_) => {
                        call.session.die(format!(
                            "the worker stopped answering: no pong within {deadline:?}"
                        ));
                        return;
                    }
                }
            }
        });
    }
}

/// One request in flight: its replies, in order.
pub(crate) struct Call {
    id: u64,
    rx: mpsc::UnboundedReceiver<Reply>,
    session: Arc<Session>,
    finished: bool,
    cancellable: bool,
}

impl Call {
    /// The next reply; `Err(reason)` when the worker died first.
    pub(crate) async fn next(&mut self) -> Result<Reply, String> {
        match self.rx.recv().await {
            Some(reply) => {
                self.finished |= reply.is_final();
                Ok(reply)
            }
            None => {
                self.finished = true;
                Err(self.session.reason().unwrap_or_else(|| "the worker is gone".into()))
            }
        }
    }

    /// The final reply, skipping tokens.
    pub(crate) async fn finish(&mut self) -> Result<Reply, String> {
        loop {
            let reply = self.next().await?;
            if reply.is_final() {
                return Ok(reply);
            }
        }
    }

    /// Asks the worker to stop this generation (its final reply still comes).
    pub(crate) fn cancel(&self) {
        let _ = self.session.call(&Op::Cancel { target: self.id });
    }
}

impl Drop for Call {
    /// A generation whose caller went away is cancelled in the worker.
    fn drop(&mut self) {
        if self.cancellable && !self.finished && self.session.reason().is_none() {
            self.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_line_over_the_bound_ends_the_session_unread() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let session = Session::start_within(ours, 64);
        let (_, mut write) = theirs.into_split();
        // A reply of 64 bytes passes the reader (not protocol, so it dies of that instead);
        // one over the bound is refused for its length, however much more follows.
        let long = format!("{}\n", "x".repeat(1 << 20));
        // Written from a task of its own: once the reader gives up, nobody drains the rest.
        let writer = tokio::spawn(async move { write.write_all(long.as_bytes()).await });
        let reason = session.died().await;
        writer.abort();
        assert_eq!(reason, "the worker wrote a line over 64 bytes");
        let (ours, theirs) = UnixStream::pair().unwrap();
        let session = Session::start_within(ours, 64);
        let (_, mut write) = theirs.into_split();
        write.write_all(format!("{}\n", "y".repeat(64)).as_bytes()).await.unwrap();
        let reason = session.died().await;
        assert!(reason.contains("not protocol"), "{reason}");
    }
}
