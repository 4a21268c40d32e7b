//! A sleeping worker: its context (KV cache, compute buffers) is gone, the weights stay
//! where they were loaded (llama.cpp cannot move offloaded weights back to the host, so on
//! a GPU sleep frees the KV cache and compute buffers only). It answers every command
//! until a wake or the channel's end; the runtime sends none but those while it sleeps.

use hangar_backend::RuntimeError;
use tokio::sync::mpsc;

use super::{Command, Reply, Worker};

/// Why a command cannot be served now.
fn asleep_error() -> RuntimeError {
    RuntimeError::Failed { message: "the llama.cpp replica is asleep: wake it first".to_owned() }
}

/// Waits asleep: the reply of the wake that ends it, or `None` when the channel closed.
pub(super) fn asleep(commands: &mut mpsc::Receiver<Command>) -> Option<Reply> {
    while let Some(command) = commands.blocking_recv() {
        match command {
            Command::Wake { reply } => return Some(reply),
            Command::Sleep { reply } => {
                let _ = reply.send(Ok(()));
            }
            Command::Slots { reply } => {
                let _ = reply.send(Vec::new());
            }
            Command::Generate { reply, .. } => {
                let _ = reply.send(Err(asleep_error()));
            }
            Command::Embed { reply, .. } => {
                let _ = reply.send(Err(asleep_error()));
            }
            Command::Rerank { reply, .. } => {
                let _ = reply.send(Err(asleep_error()));
            }
        }
    }
    None
}

impl Worker<'_> {
    /// Takes a sleep asked while awake: kept until the loop can leave for it (a sleep asked
    /// before it is answered as superseded).
    pub(super) fn ask_sleep(&mut self, reply: Reply) {
        if let Some(earlier) = self.sleep.replace(reply) {
            let message = "superseded by a later sleep".to_owned();
            let _ = earlier.send(Err(RuntimeError::Failed { message }));
        }
    }

    /// Whether the loop leaves for a sleep now: one was asked, and `idle` (nothing waits
    /// or runs); asked while work is in flight, it is refused and the work goes on.
    pub(super) fn leaves_for_sleep(&mut self, idle: bool) -> bool {
        if self.sleep.is_none() || idle {
            return self.sleep.is_some();
        }
        if let Some(reply) = self.sleep.take() {
            let message = "requests are in flight: drain them before the replica sleeps";
            let _ = reply.send(Err(RuntimeError::Failed { message: message.to_owned() }));
        }
        false
    }
}
