//! The browser rules of the edge, decided before routing: which `Origin` may call the API,
//! which `Host` names a loopback listener answers (DNS rebinding), and CORS preflights.
//!
//! A request without `Origin` (curl, the SDKs, scripts) passes the origin rule: browsers
//! send `Origin` on every cross-origin request and on every same-origin request that can
//! change state, so only a browser request can be refused by it. [`decide`] is pure; the
//! service applies its verdict.

use hangar_config::{normalize_origin, split_port};
use http::{HeaderMap, HeaderValue, Method, Uri, header};

/// The browser rules a service applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EdgePolicy {
    /// The listener is on a loopback address: only loopback names, IP addresses and
    /// `allowed_hosts` are answered.
    pub(crate) loopback_listener: bool,
    /// Origins allowed besides the request's own, normalized.
    pub(crate) allowed_origins: Vec<String>,
    /// `Host` patterns accepted besides loopback names and addresses.
    pub(crate) allowed_hosts: Vec<String>,
}

/// What the edge decided about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it; for an allowed cross-origin request, the origin to name in
    /// `Access-Control-Allow-Origin`.
    Pass { cors: Option<String> },
    /// An allowed CORS preflight: answer 204 with the CORS headers for this origin.
    Preflight { origin: String },
    /// The `Origin` (or `Sec-Fetch-Site`) is not allowed: 403 `origin_not_allowed`.
    BadOrigin(String),
    /// The `Host` is not one this listener answers: 403 `host_not_allowed`.
    BadHost(String),
}

/// Request headers a cross-origin caller may send (the preflight's allow list).
pub(crate) const ALLOWED_HEADERS: &str = "authorization, content-type, last-event-id";
/// Methods a cross-origin caller may use.
pub(crate) const ALLOWED_METHODS: &str = "GET, HEAD, POST, DELETE";

/// Decides about one request from its method, URI and headers.
pub(crate) fn decide(
    policy: &EdgePolicy,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Verdict {
    let host = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_owned));
    if let Some(host) = &host
        && !host_allowed(policy, host)
    {
        return Verdict::BadHost(format!(
            "Host `{host}` is not answered here: use localhost, an IP address or a name in \
             http.allowed_hosts"
        ));
    }
    let origin = headers.get(header::ORIGIN).map(|v| v.to_str().unwrap_or("<not text>"));
    let Some(origin) = origin else {
        return no_origin(method, headers);
    };
    let preflight =
        *method == Method::OPTIONS && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let normalized = match normalize_origin(origin) {
        Ok(n) => n,
        Err(_) => return refused(origin),
    };
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map_or("http", str::trim);
    let own = host.and_then(|h| normalize_origin(&format!("{scheme}://{h}")).ok());
    if own.as_deref() == Some(normalized.as_str()) && !preflight {
        return Verdict::Pass { cors: None };
    }
    if own.as_deref() == Some(normalized.as_str()) || policy.allowed_origins.contains(&normalized) {
        return match preflight {
            true => Verdict::Preflight { origin: origin.to_owned() },
            false => Verdict::Pass { cors: Some(origin.to_owned()) },
        };
    }
    refused(origin)
}

fn refused(origin: &str) -> Verdict {
    Verdict::BadOrigin(format!(
        "requests from origin `{origin}` are refused: only this server's own pages and the \
         origins in http.allowed_origins may call it from a browser"
    ))
}

/// A request without `Origin`: refused only when the browser says it comes from another
/// site, except a top-level navigation (a link to `/ui`), which changes nothing.
fn no_origin(method: &Method, headers: &HeaderMap) -> Verdict {
    let fetch = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let cross_site = fetch("sec-fetch-site").eq_ignore_ascii_case("cross-site");
    let navigation = fetch("sec-fetch-mode").eq_ignore_ascii_case("navigate")
        && (*method == Method::GET || *method == Method::HEAD);
    if cross_site && !navigation {
        return Verdict::BadOrigin(
            "a cross-site browser request (Sec-Fetch-Site: cross-site) is refused".into(),
        );
    }
    Verdict::Pass { cors: None }
}

/// Whether this listener answers `host` (`name[:port]`).
pub(crate) fn host_allowed(policy: &EdgePolicy, host: &str) -> bool {
    let lower = host.trim().to_ascii_lowercase();
    let (name, _) = split_port(&lower);
    let name = name.trim_end_matches('.');
    // An address cannot be rebound, and a loopback name never leaves the machine.
    let address = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name)
        .parse::<std::net::IpAddr>()
        .is_ok();
    if address || name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    let listed = policy.allowed_hosts.iter().any(|pattern| match pattern.strip_prefix('.') {
        _ if pattern == "*" => true,
        Some(domain) => {
            name == domain || name.strip_suffix(domain).is_some_and(|s| s.ends_with('.'))
        }
        None => name == pattern,
    });
    listed || (!policy.loopback_listener && policy.allowed_hosts.is_empty())
}

/// The CORS headers of an answer to an allowed cross-origin request.
pub(crate) fn cors_headers(headers: &mut HeaderMap, origin: &str, preflight: bool) {
    if let Ok(value) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    if preflight {
        let methods = HeaderValue::from_static(ALLOWED_METHODS);
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, methods);
        let allowed = HeaderValue::from_static(ALLOWED_HEADERS);
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(loopback: bool, origins: &[&str], hosts: &[&str]) -> EdgePolicy {
        EdgePolicy {
            loopback_listener: loopback,
            allowed_origins: origins.iter().map(|o| normalize_origin(o).unwrap()).collect(),
            allowed_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    /// `(method, headers)` → the verdict's kind: `pass`, `cors`, `preflight`, `origin`,
    /// `host`.
    fn check(policy: &EdgePolicy, method: &str, headers: &[(&str, &str)]) -> &'static str {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        let uri: Uri = "/v1/admin/models/chat/unload".parse().unwrap();
        match decide(policy, &method.parse().unwrap(), &uri, &map) {
            Verdict::Pass { cors: None } => "pass",
            Verdict::Pass { cors: Some(_) } => "cors",
            Verdict::Preflight { .. } => "preflight",
            Verdict::BadOrigin(_) => "origin",
            Verdict::BadHost(_) => "host",
        }
    }

    #[test]
    fn browser_rules_as_a_table() {
        let local = policy(true, &["https://ui.example.com"], &["hangar.internal"]);
        let open = policy(false, &[], &[]);
        let gated = policy(false, &[], &[".svc.cluster.local"]);
        let host = ("host", "localhost:8080");
        /// `(policy, method, headers, expected verdict)`.
        type Case<'a> = (&'a EdgePolicy, &'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            // Scripts and SDKs send no Origin: served, JSON or not.
            (&local, "POST", &[host], "pass"),
            (&local, "POST", &[host, ("content-type", "text/plain")], "pass"),
            // The server's own page.
            (&local, "POST", &[host, ("origin", "http://localhost:8080")], "pass"),
            (
                &local,
                "POST",
                &[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")],
                "pass",
            ),
            (&local, "POST", &[("host", "[::1]:8080"), ("origin", "http://[::1]:8080")], "pass"),
            // Another site, another port of the same host, `null`, garbage.
            (&local, "POST", &[host, ("origin", "https://evil.example")], "origin"),
            (&local, "POST", &[host, ("origin", "http://localhost:3000")], "origin"),
            (&local, "POST", &[host, ("origin", "null")], "origin"),
            (&local, "POST", &[host, ("origin", "localhost:8080")], "origin"),
            // The same name and port under another scheme is another origin.
            (&local, "POST", &[host, ("origin", "https://localhost:8080")], "origin"),
            (
                &local,
                "POST",
                &[host, ("origin", "https://localhost:8080"), ("x-forwarded-proto", "https")],
                "pass",
            ),
            // A configured origin gets CORS headers; its preflight is answered.
            (&local, "POST", &[host, ("origin", "https://ui.example.com")], "cors"),
            (
                &local,
                "OPTIONS",
                &[
                    host,
                    ("origin", "https://ui.example.com"),
                    ("access-control-request-method", "POST"),
                ],
                "preflight",
            ),
            (
                &local,
                "OPTIONS",
                &[
                    host,
                    ("origin", "https://evil.example"),
                    ("access-control-request-method", "POST"),
                ],
                "origin",
            ),
            // No Origin but the browser says cross-site: refused, except a navigation.
            (&local, "GET", &[host, ("sec-fetch-site", "cross-site")], "origin"),
            (
                &local,
                "POST",
                &[host, ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")],
                "origin",
            ),
            (
                &local,
                "GET",
                &[host, ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")],
                "pass",
            ),
            (&local, "GET", &[host, ("sec-fetch-site", "same-origin")], "pass"),
            // DNS rebinding on a loopback listener; addresses and listed names pass.
            (&local, "POST", &[("host", "rebind.evil.example:8080")], "host"),
            (
                &local,
                "POST",
                &[
                    ("host", "rebind.evil.example:8080"),
                    ("origin", "http://rebind.evil.example:8080"),
                ],
                "host",
            ),
            (&local, "GET", &[("host", "hangar.internal:8080")], "pass"),
            (&local, "GET", &[("host", "app.localhost:8080")], "pass"),
            (&local, "GET", &[("host", "localhost.")], "pass"),
            (&local, "GET", &[("host", "10.1.2.3:8080")], "pass"),
            // Beyond loopback, Host is checked only when allowed_hosts is set.
            (&open, "GET", &[("host", "anything.example:8080")], "pass"),
            (&gated, "GET", &[("host", "hangar.ns.svc.cluster.local")], "pass"),
            (&gated, "GET", &[("host", "svc.cluster.local")], "pass"),
            (&gated, "GET", &[("host", "evilsvc.cluster.local")], "host"),
            (&gated, "GET", &[("host", "10.0.0.7:8080")], "pass"),
            // No Host at all (HTTP/1.0): not a browser.
            (&local, "GET", &[], "pass"),
        ];
        for (i, (policy, method, headers, expected)) in cases.iter().enumerate() {
            assert_eq!(check(policy, method, headers), *expected, "case {i}: {method} {headers:?}");
        }
    }

    #[test]
    fn a_star_accepts_any_host() {
        let any = policy(true, &[], &["*"]);
        assert!(host_allowed(&any, "rebind.evil.example"));
        assert!(!host_allowed(&policy(true, &[], &[]), "rebind.evil.example"));
    }
}
