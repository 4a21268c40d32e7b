//! The error taxonomy of backends.

/// Why a load failed. The split matters: a not-found failure evicts nothing, any other
/// failure triggers "evict everything and retry once".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The model's artifact (file, directory, binary) does not exist.
    #[error("not found: {path}: {message}")]
    NotFound {
        /// What was looked for.
        path: String,
        /// Details.
        message: String,
    },
    /// The engine ran and failed to load the model (out of memory, a file it cannot read,
    /// …): the one failure evicting other models may cure.
    #[error("load failed: {message}")]
    Failed {
        /// The engine's reason.
        message: String,
    },
    /// Hangar's own checks refused the load before any engine ran (a file that is not the
    /// weights it claims, a missing engine package, a program that cannot start, arguments
    /// or a placement Hangar refuses): evicting other models cannot help.
    #[error("load failed (refused before any engine ran): {message}")]
    Refused {
        /// What Hangar found.
        message: String,
    },
    /// Another process listens on the engine's port: what answered there was not the engine
    /// Hangar started, and nothing was sent to it. Evicting models does not free the port.
    #[error("port taken: {message}")]
    PortTaken {
        /// The port.
        port: u16,
        /// Who holds it, where Hangar could see.
        message: String,
    },
    /// No adapter for this backend kind is compiled into this build.
    #[error("backend {kind} is not available in this build")]
    BackendUnavailable {
        /// The backend kind.
        kind: hangar_config::BackendKind,
    },
}

impl LoadError {
    /// Whether this failure is "the artifact does not exist", which evicts nothing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether evicting other models could let a second try succeed: only when the engine
    /// ran and failed ([`Self::Failed`]); not when the artifact is missing, Hangar refused
    /// the load before any engine ran, or another process holds the engine's port.
    pub fn eviction_may_help(&self) -> bool {
        matches!(self, Self::Failed { .. })
    }
}

/// Why a request on a loaded runtime failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The engine died; the model must be marked failed with this reason.
    #[error("backend crashed: {reason}")]
    Crashed {
        /// What happened.
        reason: String,
    },
    /// The caller went away (its event receiver was dropped).
    #[error("request cancelled")]
    Cancelled,
    /// The request is not valid for this model (too long, bad parameters, …).
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// Details.
        message: String,
    },
    /// The model does not do this (embeddings on a chat model, …).
    #[error("unsupported: {message}")]
    Unsupported {
        /// Details.
        message: String,
    },
    /// Any other engine error; the runtime stays usable.
    #[error("{message}")]
    Failed {
        /// Details.
        message: String,
    },
    /// A forwarding engine answered with an error status of its own.
    #[error("the engine answered {status}: {message}")]
    Upstream {
        /// The engine's HTTP status.
        status: u16,
        /// The engine's error message.
        message: String,
    },
    /// A forwarding engine's answer was larger than Hangar reads (`limits.max_answer_bytes`):
    /// it was cut and nothing of it reached the client.
    #[error(
        "the engine's answer is larger than {limit} bytes (limits.max_answer_bytes); it was cut"
    )]
    AnswerTooLarge {
        /// The bound, in bytes.
        limit: u64,
    },
    /// The engine did not answer in time or could not be reached (still running).
    #[error("the engine is unavailable: {message}")]
    Unavailable {
        /// Details.
        message: String,
    },
}
