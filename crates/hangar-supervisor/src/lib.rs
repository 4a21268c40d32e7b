//! Hangar's one supervisor of child processes: every engine process Hangar starts (a
//! `llama-server` or `vllm serve` child, a Python bridge worker) runs under it.
//!
//! This crate owns starting a child ([`Launch`]: program, argv, environment, address;
//! [`find_program`]), the vfork-style spawn in its own process group with its death tied to
//! Hangar's (the workspace's only `unsafe` code, `spawn.rs`), its output line by line into
//! the model's log, watching its exit, and stopping it ([`Spawner`], [`Child`]: SIGTERM to
//! the group, SIGKILL after a grace period), and the private directories children's sockets
//! live in ([`PrivateDir`]). It knows nothing of HTTP: the engines that
//! talk to their children over HTTP (`hangar-backend-process`) and the bridge, which talks
//! to its workers over pipes (`hangar-backend-bridge`), both build on it.

mod command;
mod private_dir;
mod spawn;
mod supervisor;

use std::time::Duration;

pub use command::{LOOPBACK, Launch, find_program};
pub use private_dir::PrivateDir;
pub use supervisor::{Child, Spawner};

/// How long a child may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
