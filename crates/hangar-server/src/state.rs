//! Shared state of the service.

use std::time::Instant;

use hangar_config::{ConnectionLimits, Secret};
use hangar_runtime::Manager;

use crate::admin::StaticRows;
use crate::metrics::{Endpoint, Metrics};

/// How the HTTP layer behaves; everything else comes from the [`Manager`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// When set, admin routes require `Authorization: Bearer <key>`.
    pub admin_api_key: Option<Secret>,
    /// When not empty, inference routes require `Authorization: Bearer <key>` with one of
    /// these keys or the admin key. None of them opens an admin route.
    pub inference_api_keys: Vec<Secret>,
    /// Largest accepted request body; larger ones answer 413.
    pub max_request_body_bytes: usize,
    /// Bytes of request bodies held at once, all requests together; a body that would pass
    /// it answers 503 `request_bodies_full`. Never below `max_request_body_bytes`.
    pub max_request_bodies_bytes: usize,
    /// Whether the service listens on a loopback address only: then a `Host` that is not a
    /// loopback name, an IP address or in `http.allowed_hosts` is refused (DNS rebinding).
    /// True by default; `hangard` sets it from the address it bound.
    pub loopback_listener: bool,
    /// Browser origins and hosts, what open routes show, stream and shutdown bounds.
    pub http: hangar_config::HttpPolicy,
    /// Caps on the lists of one inference request (`limits`); a list over its cap answers
    /// 400 `limit_exceeded`. (The request deadline and the lease cap are the manager's.)
    pub limits: hangar_config::Limits,
    /// What [`serve`](crate::serve) and [`grpc::serve`](crate::grpc::serve) allow each
    /// connection: how many stay open, how long a request head, a body and an idle
    /// keep-alive may take. Not applied by [`HangarService::handle`](crate::HangarService)
    /// itself: a host that mounts the service sets its own.
    pub connections: ConnectionLimits,
    /// Where `POST /v1/admin/config/reload` re-reads the config; without one it answers
    /// 501 `reload_unavailable`.
    pub config_source: Option<crate::admin::ConfigSource>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            admin_api_key: None,
            inference_api_keys: Vec::new(),
            max_request_body_bytes: hangar_config::DEFAULT_MAX_REQUEST_BODY_BYTES as usize,
            max_request_bodies_bytes: hangar_config::DEFAULT_MAX_REQUEST_BODIES_BYTES as usize,
            loopback_listener: true,
            http: hangar_config::HttpPolicy::default(),
            limits: hangar_config::Limits::default(),
            connections: ConnectionLimits::default(),
            config_source: None,
        }
    }
}

impl ServerOptions {
    /// Options from a loaded config (keys, body limit, connection limits, the `http`
    /// section and request limits). The listener counts as loopback when `host` is a
    /// loopback address or `localhost`; a host that embeds the service on another listener
    /// sets [`Self::loopback_listener`] itself.
    pub fn from_config(config: &hangar_config::Config) -> Self {
        let host = config.host.trim_start_matches('[').trim_end_matches(']');
        let loopback_listener = host.eq_ignore_ascii_case("localhost")
            || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        Self {
            loopback_listener,
            http: config.http.clone(),
            admin_api_key: config.admin_api_key.clone(),
            inference_api_keys: config.inference_api_keys.clone(),
            max_request_body_bytes: usize::try_from(config.max_request_body_bytes.get())
                .unwrap_or(usize::MAX),
            max_request_bodies_bytes: usize::try_from(config.max_request_bodies_bytes.get())
                .unwrap_or(usize::MAX),
            limits: config.limits,
            connections: config.connections,
            config_source: None,
        }
    }
}

pub(crate) struct AppState {
    pub(crate) manager: Manager,
    pub(crate) options: ServerOptions,
    /// The browser rules, from `options`.
    pub(crate) edge: crate::edge::EdgePolicy,
    /// True once the service shuts down: long-lived streams end.
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) metrics: Metrics,
    /// Every model's static row parts, encoded once.
    pub(crate) rows: StaticRows,
    /// `/openapi.json`, generated once for these options.
    pub(crate) openapi: bytes::Bytes,
    /// Request body bytes held at once, under `max_request_bodies_bytes`.
    pub(crate) bodies: std::sync::Arc<crate::body::BodyBudget>,
    pub(crate) started: Instant,
    /// Statistics of the most recent completed generation (`GET /api/v1/stats`).
    pub(crate) last_generation: std::sync::Mutex<Option<GenerationStats>>,
}

/// What `GET /api/v1/stats` reports about the most recent generation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GenerationStats {
    /// The model that served it.
    pub(crate) model: String,
    /// The endpoint it came through.
    pub(crate) endpoint: Endpoint,
    /// Seconds from the start of generation to the first generated piece.
    pub(crate) time_to_first_token: Option<f64>,
    /// Generated tokens per second after the first one.
    pub(crate) tokens_per_second: Option<f64>,
    /// Prompt tokens.
    pub(crate) input_tokens: u32,
    /// Generated tokens.
    pub(crate) output_tokens: u32,
    /// Unix milliseconds when it finished.
    pub(crate) finished_unix_ms: u64,
}
