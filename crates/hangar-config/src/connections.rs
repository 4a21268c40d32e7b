//! `connections`: how many connections a listener holds open and how long a connection may
//! take to say what it wants ([`ConnectionLimits`]).

use std::num::NonZeroU32;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// `connections` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ConnectionsFields {
    /// Connections each listener (HTTP, gRPC) holds open at once. At the limit a new
    /// connection closes the one that has waited longest for a request; when every
    /// connection has a request in flight, the new one is closed at once. Default 1024.
    max_connections: Option<u32>,
    /// Seconds a new connection has to send its first complete request head (HTTP/1) or
    /// open its first stream (HTTP/2, gRPC) before it is closed. Default 20.
    header_read_timeout_s: Option<u32>,
    /// Seconds a request body has to arrive in full, from the end of its head; a body still
    /// arriving then is answered 408 `body_timeout` and its connection closed. Default 60.
    body_read_timeout_s: Option<u32>,
    /// Seconds a kept-alive connection may wait for its next request before it is closed.
    /// Default 120.
    idle_timeout_s: Option<u32>,
    /// Calls one connection may run at once without a valid key while keys are set (open
    /// routes, the local repository agent); one more is refused (HTTP 429, gRPC
    /// RESOURCE_EXHAUSTED) before its body is read. Default 8.
    max_keyless_streams: Option<u32>,
    /// Calls one connection may have refused (a missing or wrong key, a keyless call over
    /// `max_keyless_streams`); the next refused call closes the connection unanswered.
    /// Default 32.
    max_refused_calls: Option<u32>,
}

impl Section for ConnectionsFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        p.at_least("max_connections", self.max_connections, 1);
        p.at_least("header_read_timeout_s", self.header_read_timeout_s, 1);
        p.at_least("body_read_timeout_s", self.body_read_timeout_s, 1);
        p.at_least("idle_timeout_s", self.idle_timeout_s, 1);
        p.at_least("max_keyless_streams", self.max_keyless_streams, 1);
        p.at_least("max_refused_calls", self.max_refused_calls, 1);
    }
}

/// Default `connections.max_connections`: far more clients than a model server runs
/// requests for at once (each model queues 64 by default), while a listener full of held
/// connections stays cheap (about 32 KiB each, measured: some 32 MiB) and both listeners
/// together fit Linux's usual hard descriptor limits with room for model files and engines.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;
/// Default `connections.header_read_timeout_s`. Clients send a request head right after
/// connecting; the slack is for preconnecting clients and slow links, and a flood is
/// handled by the connection cap, not by this timeout.
pub const DEFAULT_HEADER_READ_TIMEOUT_S: u64 = 20;
/// Default `connections.body_read_timeout_s`: the largest default body (8 MiB) at about
/// 140 KB/s.
pub const DEFAULT_BODY_READ_TIMEOUT_S: u64 = 60;
/// Default `connections.idle_timeout_s`: longer than the idle timeout of common client
/// pools (90 s), so a client rarely reuses a connection the server is closing.
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 120;
/// Default `connections.max_keyless_streams`: health probes and a repository agent run a
/// call or two at a time; a stream flood without a key holds at most this many bodies.
pub const DEFAULT_MAX_KEYLESS_STREAMS: u32 = 8;
/// Default `connections.max_refused_calls`: a client with a stale key retries a few times;
/// a connection that keeps sending refused calls is probing.
pub const DEFAULT_MAX_REFUSED_CALLS: u32 = 32;

/// The limits every listener applies to its connections (`connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections a listener holds open at once.
    pub max_connections: NonZeroU32,
    /// How long a new connection may take to send its first request head.
    pub header_read_timeout: Duration,
    /// How long a request body may take to arrive in full.
    pub body_read_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Calls a connection may run at once without a valid key while keys are set.
    pub max_keyless_streams: NonZeroU32,
    /// Refused calls a connection may send before the next one closes it.
    pub max_refused_calls: NonZeroU32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::from(ConnectionsFields::default())
    }
}

impl From<ConnectionsFields> for ConnectionLimits {
    fn from(f: ConnectionsFields) -> Self {
        let secs = |v: Option<u32>, default: u64| Duration::from_secs(v.map_or(default, u64::from));
        let count = |v: Option<u32>, default: u32| {
            v.and_then(NonZeroU32::new).or(NonZeroU32::new(default)).unwrap_or(NonZeroU32::MIN)
        };
        Self {
            max_connections: f
                .max_connections
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::new(DEFAULT_MAX_CONNECTIONS).unwrap_or(NonZeroU32::MIN)),
            header_read_timeout: secs(f.header_read_timeout_s, DEFAULT_HEADER_READ_TIMEOUT_S),
            body_read_timeout: secs(f.body_read_timeout_s, DEFAULT_BODY_READ_TIMEOUT_S),
            idle_timeout: secs(f.idle_timeout_s, DEFAULT_IDLE_TIMEOUT_S),
            max_keyless_streams: count(f.max_keyless_streams, DEFAULT_MAX_KEYLESS_STREAMS),
            max_refused_calls: count(f.max_refused_calls, DEFAULT_MAX_REFUSED_CALLS),
        }
    }
}

impl ConnectionLimits {
    /// The effective `connections` object, as `config check` shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "max_connections": self.max_connections,
            "header_read_timeout_s": self.header_read_timeout.as_secs(),
            "body_read_timeout_s": self.body_read_timeout.as_secs(),
            "idle_timeout_s": self.idle_timeout.as_secs(),
            "max_keyless_streams": self.max_keyless_streams,
            "max_refused_calls": self.max_refused_calls,
        })
    }
}
