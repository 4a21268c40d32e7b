//! vLLM's sleep mode for `vllm_serve` children ([`SleepRoutes`]), as vLLM's server offers it
//! with `--enable-sleep-mode` in development mode (`VLLM_SERVER_DEV_MODE=1`):
//!
//! - `POST /sleep?level=1` moves the weights to host memory and discards the KV cache;
//!   `level=2` discards both (the weights are read again on waking);
//! - `POST /wake_up` takes the GPU memory back; after level 2 the weights must be reloaded
//!   in between: `POST /wake_up?tags=weights`, `POST /collective_rpc` with
//!   `{"method": "reload_weights"}`, then `POST /wake_up?tags=kv_cache` (woken without the
//!   reload, the engine answers from uninitialised memory);
//! - `GET /is_sleeping` answers `{"is_sleeping": bool}`: each step is confirmed there.
//!
//! These routes take no key in vLLM (its key guards `/v1` only), and development mode adds
//! others as open (`/collective_rpc` runs a method in every worker). So a child with sleep
//! mode listens on a Unix socket in a fresh directory only Hangar's user can enter
//! ([`socket_dir`]), never on a TCP port any local user could reach.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{LoadError, RuntimeError, SleepLevel};
use hangar_supervisor::PrivateDir;
use http::Method;
use serde_json::Value;

use crate::upstream::Upstream;

/// The levels of vLLM's sleep, lightest first.
pub(crate) const LEVELS: [SleepLevel; 2] =
    [SleepLevel::WeightsToHost, SleepLevel::WeightsDiscarded];

/// The longest path a Unix socket address holds (`sun_path`, less its final NUL).
const SOCKET_PATH_MAX: usize = 107;

/// A child's socket, in a fresh private directory (mode 0700, under the system's temporary
/// directory; removed when dropped, or by the next `hangard` when this one was killed).
///
/// # Errors
/// [`LoadError::Refused`] when it cannot be created, or its socket's path would be too long.
pub(crate) fn socket_dir() -> Result<(PrivateDir, PathBuf), LoadError> {
    let failed = |message: String| LoadError::Refused { message };
    let dir = PrivateDir::create()
        .map_err(|e| failed(format!("cannot create the directory of the child's socket: {e}")))?;
    let socket = dir.socket();
    if socket.as_os_str().len() > SOCKET_PATH_MAX {
        return Err(failed(format!(
            "the child's socket path {} is longer than a Unix socket allows ({SOCKET_PATH_MAX} \
             bytes): set TMPDIR to a shorter directory",
            socket.display()
        )));
    }
    Ok((dir, socket))
}

/// vLLM's sleep routes on one child, and the level it sleeps at.
pub(crate) struct SleepRoutes {
    /// How long one step may take (the model's `load_timeout_s`: level 1 copies the weights
    /// to host memory, level 2 reads them again from disk).
    timeout: Duration,
    /// The level it sleeps at; `None` awake.
    asleep: Mutex<Option<SleepLevel>>,
}

impl SleepRoutes {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { timeout, asleep: Mutex::new(None) }
    }

    /// Puts the child to sleep at `level` and checks that it says so.
    ///
    /// # Errors
    /// [`RuntimeError::Unsupported`] for a level vLLM does not have; [`RuntimeError::Failed`]
    /// with vLLM's answer when it refused or does not say it sleeps.
    pub(crate) async fn sleep(
        &self,
        upstream: &Upstream,
        level: SleepLevel,
    ) -> Result<(), RuntimeError> {
        let number = match level {
            SleepLevel::WeightsToHost => 1,
            SleepLevel::WeightsDiscarded => 2,
            SleepLevel::Context => {
                let message = "vLLM sleeps at weights_to_host (1) or weights_discarded (2)";
                return Err(RuntimeError::Unsupported { message: message.into() });
            }
        };
        self.post(upstream, &format!("/sleep?level={number}"), Bytes::new()).await?;
        self.confirm(upstream, true).await?;
        *self.lock() = Some(level);
        Ok(())
    }

    /// Wakes the child (reloading the weights after level 2) and checks that it says so.
    ///
    /// # Errors
    /// [`RuntimeError::Failed`] with vLLM's answer to the step that failed.
    pub(crate) async fn wake(&self, upstream: &Upstream) -> Result<(), RuntimeError> {
        let level = *self.lock();
        match level {
            None => return self.confirm(upstream, false).await,
            Some(SleepLevel::WeightsDiscarded) => {
                self.post(upstream, "/wake_up?tags=weights", Bytes::new()).await?;
                let reload = Bytes::from_static(br#"{"method":"reload_weights"}"#);
                self.post(upstream, "/collective_rpc", reload).await?;
                self.post(upstream, "/wake_up?tags=kv_cache", Bytes::new()).await?;
            }
            Some(_) => self.post(upstream, "/wake_up", Bytes::new()).await?,
        }
        self.confirm(upstream, false).await?;
        *self.lock() = None;
        Ok(())
    }

    /// `POST route` with `body`: Ok on a 2xx answer.
    async fn post(
        &self,
        upstream: &Upstream,
        route: &str,
        body: Bytes,
    ) -> Result<(), RuntimeError> {
        let url = format!("http://localhost{route}");
        match upstream.call(Method::POST, &url, body, self.timeout).await {
            Ok((200..=299, _)) => Ok(()),
            Ok((status, body)) => Err(failed(&format!(
                "vLLM answered {status} to POST {route}: {}",
                String::from_utf8_lossy(&body)
            ))),
            Err(why) => Err(failed(&format!("POST {route}: {why}"))),
        }
    }

    /// Whether `GET /is_sleeping` says `sleeping`.
    async fn confirm(&self, upstream: &Upstream, sleeping: bool) -> Result<(), RuntimeError> {
        let url = "http://localhost/is_sleeping";
        let said = match upstream.call(Method::GET, url, Bytes::new(), self.timeout).await {
            Ok((200, body)) => serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("is_sleeping").and_then(Value::as_bool)),
            Ok((status, _)) => {
                return Err(failed(&format!("vLLM answered {status} to GET /is_sleeping")));
            }
            Err(why) => return Err(failed(&format!("GET /is_sleeping: {why}"))),
        };
        match said {
            Some(s) if s == sleeping => Ok(()),
            Some(s) => Err(failed(&format!(
                "vLLM says is_sleeping: {s} after it was asked to {}",
                if sleeping { "sleep" } else { "wake up" }
            ))),
            None => Err(failed("vLLM's GET /is_sleeping answered no is_sleeping field")),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SleepLevel>> {
        self.asleep.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn failed(message: &str) -> RuntimeError {
    RuntimeError::Failed { message: message.to_owned() }
}
