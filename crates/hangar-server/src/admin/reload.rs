//! Config reload (`POST /v1/admin/config/reload`, and `SIGHUP` in `hangard`): re-read the
//! config the host named ([`ConfigSource`]) and apply its models and model repository
//! ([`hangar_runtime::Manager::apply_config`]). Settings other than the models apply at the
//! next start: the answer names the ones that changed.

use std::sync::Arc;

use hangar_config::{Config, ConfigError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::{Response, json_response};
use crate::error::{ApiError, ConfigProblem, HttpCode};
use crate::router::Ctx;
use crate::state::AppState;

/// Where a config reload reads the config: the host's files (`hangard` re-reads its config
/// directory with its command line's overrides), and the settings in effect since start.
#[derive(Clone)]
pub struct ConfigSource {
    read: Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
    /// The settings in effect (every one but `models`, as effective JSON).
    running: Arc<serde_json::Map<String, Value>>,
}

impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSource").finish_non_exhaustive()
    }
}

impl ConfigSource {
    /// A source that `read`s the config (blocking I/O is fine: it runs off the async
    /// threads); `running` is the config the service started with.
    pub fn new(
        running: &Config,
        read: impl Fn() -> Result<Config, ConfigError> + Send + Sync + 'static,
    ) -> Self {
        Self { read: Arc::new(read), running: Arc::new(running.settings_json()) }
    }
}

/// What a config reload changed (`POST /v1/admin/config/reload`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReloadResponse {
    /// Models that joined, in config order.
    pub added: Vec<String>,
    /// Models that left: they answer to no name from now on and are unloaded gracefully
    /// (running requests finish) in the background.
    pub removed: Vec<String>,
    /// Models whose changed definition is in effect now (nothing of them was running).
    pub changed: Vec<String>,
    /// Models whose changed definition waits for their next load (after an unload); their
    /// rows' `pending_definition` shows it.
    pub pending: Vec<String>,
    /// Settings other than `models` that differ from the ones in effect: they apply at the
    /// next start of the server, not now.
    pub restart_required: Vec<String>,
}

/// `POST /v1/admin/config/reload`.
pub(crate) async fn reload(ctx: Ctx) -> Result<Response, ApiError> {
    let answer = reload_config(&ctx.state).await?;
    Ok(json_response(http::StatusCode::OK, &answer))
}

/// Re-reads the config and applies its models; an invalid config changes nothing and
/// answers every problem at once.
pub(crate) async fn reload_config(state: &AppState) -> Result<ReloadResponse, ApiError> {
    let Some(source) = state.options.config_source.clone() else {
        return Err(ApiError::new(
            HttpCode::ReloadUnavailable,
            "this service was given no config to re-read",
        ));
    };
    let read = Arc::clone(&source.read);
    let config = tokio::task::spawn_blocking(move || read())
        .await
        .map_err(|e| ApiError::new(HttpCode::InvalidConfig, format!("reading the config: {e}")))?
        .map_err(invalid)?;
    let changes = state.manager.apply_config(&config).await;
    let new = config.settings_json();
    let mut restart_required: Vec<String> = new
        .iter()
        .filter(|(key, value)| source.running.get(*key) != Some(value))
        .map(|(key, _)| key.clone())
        .collect();
    restart_required.sort();
    if !restart_required.is_empty() {
        tracing::warn!(settings = ?restart_required, "config reload: these settings changed and apply at the next start");
    }
    let names = |list: Vec<hangar_config::ModelName>| list.iter().map(|n| n.to_string()).collect();
    Ok(ReloadResponse {
        added: names(changes.added),
        removed: names(changes.removed),
        changed: names(changes.changed),
        pending: names(changes.pending),
        restart_required,
    })
}

/// 400 `invalid_config` with every problem of `error`.
fn invalid(error: ConfigError) -> ApiError {
    let problems = match &error {
        ConfigError::Invalid(errors) => errors
            .iter()
            .map(|e| ConfigProblem { path: e.path.clone(), message: e.message.clone() })
            .collect(),
        other => vec![ConfigProblem { path: String::new(), message: other.to_string() }],
    };
    let count = problems.len();
    let mut api = ApiError::new(
        HttpCode::InvalidConfig,
        format!("the config has {count} problem(s); nothing changed: {error}"),
    );
    api.problems = Some(problems);
    api
}
