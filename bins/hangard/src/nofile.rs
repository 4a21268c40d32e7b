//! The descriptor limit (`RLIMIT_NOFILE`): raised at start to what the system allows, so that
//! `connections.max_connections` on each listener fits beside model files, engine pipes and
//! the state directory; a warning when it still does not. Where descriptors run out all the
//! same, the listeners pause accepting instead of spinning (`hangar_server::serve`).

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept for everything but client connections: model and state files, engine
/// processes' pipes and sockets, the runtime's own.
const RESERVED: u64 = 256;
/// The soft limit is not raised beyond this (Linux's default `fs.nr_open`).
const CEILING: u64 = 1 << 20;

/// Raises the soft limit toward the hard one, for `listeners` listeners of
/// `max_connections` each; logs what it did and whether that is enough.
pub(crate) fn raise(max_connections: u32, listeners: u64) {
    let needed = u64::from(max_connections) * listeners + RESERVED;
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the descriptor limit (RLIMIT_NOFILE)");
            return;
        }
    };
    let wanted = hard.min(CEILING);
    let soft = if soft < wanted {
        match setrlimit(Resource::RLIMIT_NOFILE, wanted, hard) {
            Ok(()) => {
                tracing::debug!(from = soft, to = wanted, "raised the descriptor limit");
                wanted
            }
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "cannot raise the descriptor limit");
                soft
            }
        }
    } else {
        soft
    };
    if soft < needed {
        tracing::warn!(
            limit = soft,
            needed,
            "the descriptor limit (RLIMIT_NOFILE) is below connections.max_connections per \
             listener plus {RESERVED}: a flood meets EMFILE first, where accepting pauses; \
             raise the hard limit or lower max_connections"
        );
    }
}
