//! Shared state of the service.

use std::time::Instant;

use hangar_config::Secret;
use hangar_runtime::Manager;

use crate::metrics::Metrics;

/// How the HTTP layer behaves; everything else comes from the [`Manager`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// When set, admin routes require `Authorization: Bearer <key>`.
    pub admin_api_key: Option<Secret>,
    /// Largest accepted request body; larger ones answer 413.
    pub max_request_body_bytes: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            admin_api_key: None,
            max_request_body_bytes: hangar_config::DEFAULT_MAX_REQUEST_BODY_BYTES as usize,
        }
    }
}

impl ServerOptions {
    /// Options from a loaded config (admin key and body limit).
    pub fn from_config(config: &hangar_config::Config) -> Self {
        Self {
            admin_api_key: config.admin_api_key.clone(),
            max_request_body_bytes: usize::try_from(config.max_request_body_bytes.get())
                .unwrap_or(usize::MAX),
        }
    }
}

pub(crate) struct AppState {
    pub(crate) manager: Manager,
    pub(crate) options: ServerOptions,
    pub(crate) metrics: Metrics,
    pub(crate) started: Instant,
}
