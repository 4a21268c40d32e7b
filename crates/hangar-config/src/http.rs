//! The `http` section: who may drive the HTTP edge from a browser, what the open routes
//! show, and how long streams and shutdown may take.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// Default `http.stream_write_timeout_s`.
pub const DEFAULT_STREAM_WRITE_TIMEOUT_S: u64 = 60;
/// Default `http.shutdown_timeout_s`: below Kubernetes' default 30 s grace period, so
/// `hangard` has stopped its engines before the kubelet's SIGKILL.
pub const DEFAULT_SHUTDOWN_TIMEOUT_S: u64 = 25;

/// `http` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct HttpFields {
    /// Browser origins (`https://ui.example.com`, `http://localhost:3000`) allowed to call
    /// the API besides the server's own. A request with another `Origin`, `Origin: null` or
    /// `Sec-Fetch-Site: cross-site` is refused with 403 `origin_not_allowed`.
    allowed_origins: Option<Vec<String>>,
    /// `Host` names accepted besides loopback names (`localhost`, `*.localhost`) and IP
    /// addresses: exact names, `.example.com` for every name under a domain, or `*` for any.
    /// On a loopback listener any other name is refused (DNS rebinding); on other listeners
    /// `Host` is checked only when this is set.
    allowed_hosts: Option<Vec<String>>,
    /// Whether `/metrics` needs an inference (or the admin) key when inference keys are
    /// set. Default false: scrapers stay keyless.
    metrics_require_key: Option<bool>,
    /// Whether a peer on a loopback address may call the v2 repository index, load and
    /// unload (HTTP and gRPC) without the admin key, as KServe's model agent does from its
    /// sidecar; nothing else opens. Off by default; leave it off behind a reverse proxy on
    /// the same machine (requests that carry `Forwarded` or `X-Forwarded-For` never count).
    trust_local_repository_agent: Option<bool>,
    /// Seconds an answer may wait for a client that takes none of its bytes (a full send
    /// buffer, a zero HTTP/2 window): a server-sent event stream then ends and its
    /// generation is cancelled, and a connection whose every answer waits so long is closed
    /// (an answer still being computed never counts). Default 60.
    stream_write_timeout_s: Option<u64>,
    /// Seconds from SIGTERM to exit: event streams end at once, requests drain, engines
    /// stop. Default 25.
    shutdown_timeout_s: Option<u64>,
}

impl Section for HttpFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        for (i, origin) in self.allowed_origins.iter().flatten().enumerate() {
            if let Err(why) = normalize_origin(origin) {
                p.nested("allowed_origins").push(&i.to_string(), why);
            }
        }
        let hosts = self.allowed_hosts.iter().flatten();
        for (i, host) in hosts.enumerate() {
            if let Err(why) = check_host_pattern(host) {
                p.nested("allowed_hosts").push(&i.to_string(), why);
            }
        }
        p.at_least("stream_write_timeout_s", self.stream_write_timeout_s, 1);
        p.at_least("shutdown_timeout_s", self.shutdown_timeout_s, 1);
    }
}

/// The `http` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPolicy {
    /// Allowed browser origins besides the server's own, normalized (`scheme://host[:port]`,
    /// lowercase, default port left out).
    pub allowed_origins: Vec<String>,
    /// Accepted `Host` patterns besides loopback names and IP addresses (lowercase).
    pub allowed_hosts: Vec<String>,
    /// Whether `/metrics` needs a key when inference keys are set.
    pub metrics_require_key: bool,
    /// Whether loopback peers may call the v2 repository index, load and unload without
    /// the admin key.
    pub trust_local_repository_agent: bool,
    /// How long a server-sent event waits for a client that stopped reading.
    pub stream_write_timeout: Duration,
    /// Bound on the whole shutdown.
    pub shutdown_timeout: Duration,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        Self::from(HttpFields::default())
    }
}

impl From<HttpFields> for HttpPolicy {
    fn from(f: HttpFields) -> Self {
        let secs = |v: Option<u64>, default: u64| Duration::from_secs(v.unwrap_or(default));
        Self {
            // Checked by `HttpFields::check`.
            allowed_origins: f
                .allowed_origins
                .unwrap_or_default()
                .iter()
                .filter_map(|o| normalize_origin(o).ok())
                .collect(),
            allowed_hosts: f
                .allowed_hosts
                .unwrap_or_default()
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            metrics_require_key: f.metrics_require_key.unwrap_or(false),
            trust_local_repository_agent: f.trust_local_repository_agent.unwrap_or(false),
            stream_write_timeout: secs(f.stream_write_timeout_s, DEFAULT_STREAM_WRITE_TIMEOUT_S),
            shutdown_timeout: secs(f.shutdown_timeout_s, DEFAULT_SHUTDOWN_TIMEOUT_S),
        }
    }
}

impl HttpPolicy {
    /// The section as the effective config shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "allowed_origins": self.allowed_origins,
            "allowed_hosts": self.allowed_hosts,
            "metrics_require_key": self.metrics_require_key,
            "trust_local_repository_agent": self.trust_local_repository_agent,
            "stream_write_timeout_s": self.stream_write_timeout.as_secs(),
            "shutdown_timeout_s": self.shutdown_timeout.as_secs(),
        })
    }
}

/// An origin as browsers send it (`scheme://host[:port]`), normalized: lowercase, the
/// scheme's default port left out.
///
/// # Errors
/// Why it is not an origin (`null`, a wildcard, a path, another scheme).
pub fn normalize_origin(origin: &str) -> Result<String, String> {
    let origin = origin.trim();
    let (scheme, rest) = origin
        .split_once("://")
        .ok_or_else(|| format!("`{origin}` is not an origin: expected scheme://host[:port]"))?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return Err(format!("`{origin}`: the scheme must be http or https")),
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', '*', ' ']) {
        return Err(format!(
            "`{origin}` is not an origin: expected scheme://host[:port], no path or wildcard"
        ));
    }
    let authority = rest.to_ascii_lowercase();
    let (host, port) = split_port(&authority);
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(format!("`{origin}`: the host or port is not valid"));
    }
    Ok(match port {
        Some(p) if p == default_port => format!("{scheme}://{host}"),
        _ => format!("{scheme}://{authority}"),
    })
}

/// `host[:port]` → (`host`, `port`); a bracketed IPv6 address keeps its brackets.
pub fn split_port(authority: &str) -> (&str, Option<&str>) {
    if let Some(end) = authority.strip_prefix('[').and_then(|r| r.find(']')) {
        let (host, rest) = authority.split_at(end + 2);
        return (host, rest.strip_prefix(':'));
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (authority, None),
    }
}

fn check_host_pattern(pattern: &str) -> Result<(), String> {
    let p = pattern.trim();
    if p == "*" {
        return Ok(());
    }
    let name = p.strip_prefix('.').unwrap_or(p);
    let valid = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`{pattern}` is not a host name: expected a name (`hangar.example.com`), a domain \
             (`.example.com`) or `*`; no scheme, port or path"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_normalize_and_bad_ones_are_named() {
        let ok = [
            ("http://localhost:8080", "http://localhost:8080"),
            ("HTTPS://UI.Example.com:443", "https://ui.example.com"),
            ("http://127.0.0.1:80", "http://127.0.0.1"),
            ("http://[::1]:8080", "http://[::1]:8080"),
        ];
        for (given, expected) in ok {
            assert_eq!(normalize_origin(given).as_deref(), Ok(expected), "{given}");
        }
        for bad in [
            "null",
            "*",
            "localhost:8080",
            "ftp://x",
            "http://x/path",
            "http://",
            "http://x:99999",
            "https://*.x.com",
        ] {
            assert!(normalize_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_split_off_names_and_addresses() {
        assert_eq!(split_port("localhost:8080"), ("localhost", Some("8080")));
        assert_eq!(split_port("localhost"), ("localhost", None));
        assert_eq!(split_port("[::1]:8080"), ("[::1]", Some("8080")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
        assert_eq!(split_port("::1"), ("::1", None));
    }

    #[test]
    fn host_patterns_are_names_domains_or_any() {
        for ok in ["*", "hangar.example.com", ".example.com", "svc_1"] {
            assert!(check_host_pattern(ok).is_ok(), "{ok}");
        }
        for bad in ["", "http://x", "x:80", "x/y", "*.example.com", "."] {
            assert!(check_host_pattern(bad).is_err(), "{bad}");
        }
    }
}
