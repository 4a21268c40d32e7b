//! Bearer keys: which key a route class needs, and whether a caller may see the details the
//! open routes leave out while keys are set.

use hangar_config::Secret;
use http::{HeaderMap, header};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, HttpCode};
use crate::router::Auth;
use crate::state::ServerOptions;

/// Checks the bearer key a route of class `auth` needs: admin routes the admin key;
/// inference routes an inference key or the admin key; each class is open while it has
/// no key configured. `Metrics` is open unless `http.metrics_require_key`, then an
/// inference route. Inference keys may also come as `x-api-key` (Anthropic's clients send
/// them so); the admin routes take only `Authorization: Bearer`.
pub(crate) fn authorize(
    options: &ServerOptions,
    auth: Auth,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    // The keys of the class itself: open while there are none; the admin key opens
    // inference routes too. No allocation: this runs on every inference request.
    let (own, class): (&[Secret], &str) = match auth {
        Auth::Open => return Ok(()),
        Auth::Metrics if !options.http.metrics_require_key => return Ok(()),
        Auth::Admin => (options.admin_api_key.as_slice(), "admin"),
        Auth::Inference | Auth::Metrics => (&options.inference_api_keys, "inference"),
    };
    if own.is_empty() {
        return Ok(());
    }
    let admin: &[Secret] = if auth == Auth::Admin { &[] } else { options.admin_api_key.as_slice() };
    let given = if auth == Auth::Admin { bearer(headers) } else { inference_key(headers) };
    let Some(given) = given else {
        return Err(ApiError::new(
            HttpCode::Unauthorized,
            format!("{class} routes need `Authorization: Bearer <{class} key>`"),
        ));
    };
    if matches_any(own.iter().chain(admin), given) {
        Ok(())
    } else {
        Err(ApiError::new(HttpCode::Forbidden, format!("the key is not valid for {class} routes")))
    }
}

/// The address a request came from, as the listener saw it: [`serve`](crate::serve) puts
/// it in each request's extensions (gRPC calls read it from their connection); a host that
/// mounts the service may too. Without it no HTTP request counts as a local agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Whether a call is a trusted local agent's (KServe's model agent in the pod's sidecar):
/// `http.trust_local_repository_agent` is on, the route is the v2 repository index, a load
/// or an unload (`path`: the route's pattern or the request's path), the peer is on a
/// loopback address, no proxy header says the request came from elsewhere, and the
/// listener is on loopback or checks `Host` (`http.allowed_hosts`), so no page with a
/// rebound name can pass for the agent. Such a call needs no admin key, and may do only
/// what KServe's agent does ([`Caller::LocalAgent`]); nothing else opens.
pub(crate) fn local_agent(
    options: &ServerOptions,
    method: &http::Method,
    path: &str,
    peer: Option<std::net::IpAddr>,
    headers: &HeaderMap,
) -> bool {
    let repository_call = path == "/v2/repository/index"
        || path
            .strip_prefix("/v2/repository/models/")
            .is_some_and(|rest| rest.ends_with("/load") || rest.ends_with("/unload"));
    let proxied =
        headers.contains_key(header::FORWARDED) || headers.contains_key("x-forwarded-for");
    let host_checked = options.loopback_listener || !options.http.allowed_hosts.is_empty();
    options.http.trust_local_repository_agent
        && host_checked
        && method == http::Method::POST
        && repository_call
        && peer.is_some_and(|ip| ip.to_canonical().is_loopback())
        && !proxied
}

/// Who makes a v2 repository call: a caller the keys let in, or the keyless local agent,
/// which may index, load and unload only the models of the model repository folder —
/// never a configured, pinned or leased one, never with an override patch — and sees the
/// index's reasons only for those models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The keys (or their absence) let the call in.
    Keyed,
    /// Let in without a key as the trusted local agent.
    LocalAgent,
}

impl Caller {
    /// Who is calling `method path` with `headers` from `peer`, or the refusal of the keys
    /// that route class needs.
    ///
    /// # Errors
    /// The auth error when neither the keys nor the local-agent rule let the call in.
    pub(crate) fn of(
        options: &ServerOptions,
        auth: Auth,
        method: &http::Method,
        path: &str,
        peer: Option<std::net::IpAddr>,
        headers: &HeaderMap,
    ) -> Result<Self, ApiError> {
        match authorize(options, auth, headers) {
            Ok(()) => Ok(Self::Keyed),
            Err(_) if local_agent(options, method, path, peer, headers) => Ok(Self::LocalAgent),
            Err(e) => Err(e),
        }
    }
}

/// How the keys let a call in, decided from its head alone (the listeners' gate, before a
/// byte of the body is read): refused; keyed (a valid key, or a server with no key set at
/// all, where there is nothing to bound); or keyless (an open route, a class without keys,
/// or the local agent, while some key is set).
pub(crate) fn classify(
    options: &ServerOptions,
    auth: Auth,
    method: &http::Method,
    path: &str,
    peer: Option<std::net::IpAddr>,
    headers: &HeaderMap,
) -> crate::listen::CallClass {
    use crate::listen::CallClass;
    let keys_set = options.admin_api_key.is_some() || !options.inference_api_keys.is_empty();
    match Caller::of(options, auth, method, path, peer, headers) {
        Err(_) => CallClass::Refused,
        Ok(_) if !keys_set => CallClass::Keyed,
        Ok(Caller::Keyed) if presents_a_key(options, headers) => CallClass::Keyed,
        Ok(_) => CallClass::Keyless,
    }
}

/// Whether `headers` carry a configured key (bearer, or `x-api-key` for inference keys).
fn presents_a_key(options: &ServerOptions, headers: &HeaderMap) -> bool {
    let keys = options.inference_api_keys.iter().chain(options.admin_api_key.as_slice());
    inference_key(headers).is_some_and(|given| matches_any(keys, given))
}

/// Whether the caller may see what the open routes (`/api/v1/health`,
/// `/v2/models/{name}/ready`) show only to key holders — model paths, engine URLs, error
/// texts: always while no key is configured, else with a valid inference or admin key.
pub(crate) fn discloses(options: &ServerOptions, headers: &HeaderMap) -> bool {
    let no_keys = options.admin_api_key.is_none() && options.inference_api_keys.is_empty();
    no_keys || presents_a_key(options, headers)
}

/// The key of an inference request: the bearer token, else an `x-api-key` header.
pub(crate) fn inference_key(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).or_else(|| {
        let key = headers.get("x-api-key")?.to_str().ok()?.trim();
        (!key.is_empty()).then_some(key)
    })
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is matched without
/// regard to case, as RFC 9110 says.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    let token = token.trim_start();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares `given` with every key: `subtle` compares without an early exit on the first
/// differing byte, and no key is skipped once one matched.
fn matches_any<'a>(keys: impl Iterator<Item = &'a Secret>, given: &str) -> bool {
    let valid = keys.fold(subtle::Choice::from(0), |found, key| {
        found | given.as_bytes().ct_eq(key.expose().as_bytes())
    });
    bool::from(valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_without_case() {
        let token = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            bearer(&headers).map(str::to_owned)
        };
        for value in
            ["Bearer k1", "bearer k1", "BEARER k1", "Bearer   k1", "Bearer\tk1", " Bearer k1 "]
        {
            assert_eq!(token(value).as_deref(), Some("k1"), "{value:?}");
        }
        for value in ["Basic k1", "Bearer", "Bearer ", "Bearerk1", "k1"] {
            assert_eq!(token(value), None, "{value:?}");
        }
    }

    #[test]
    fn a_local_agent_is_a_loopback_peer_on_the_three_repository_calls_only() {
        let mut options = ServerOptions::default();
        options.http.trust_local_repository_agent = true;
        let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let far: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let none = HeaderMap::new();
        let mut proxied = HeaderMap::new();
        proxied.insert("x-forwarded-for", "192.0.2.7".parse().unwrap());
        let post = http::Method::POST;
        // (method, path, peer, headers, trusted)
        let rows: [(&http::Method, &str, Option<std::net::IpAddr>, &HeaderMap, bool); 10] = [
            (&post, "/v2/repository/index", Some(loopback), &none, true),
            (&post, "/v2/repository/models/{name}/load", Some(loopback), &none, true),
            (&post, "/v2/repository/models/m/unload", Some(loopback), &none, true),
            (&http::Method::GET, "/v2/repository/index", Some(loopback), &none, false),
            (&post, "/v2/repository/models/m/other", Some(loopback), &none, false),
            (&post, "/v1/admin/models/m/load", Some(loopback), &none, false),
            (&post, "/v1/admin/config/reload", Some(loopback), &none, false),
            (&post, "/v2/repository/index", Some(far), &none, false),
            (&post, "/v2/repository/index", None, &none, false),
            (&post, "/v2/repository/index", Some(loopback), &proxied, false),
        ];
        for (method, path, peer, headers, trusted) in rows {
            assert_eq!(
                local_agent(&options, method, path, peer, headers),
                trusted,
                "{method} {path} {peer:?}"
            );
        }
        // On a wide listener, only where `Host` is checked (no rebound name gets through).
        options.loopback_listener = false;
        assert!(!local_agent(&options, &post, "/v2/repository/index", Some(loopback), &none));
        options.http.allowed_hosts = vec!["hangar.internal".into()];
        assert!(local_agent(&options, &post, "/v2/repository/index", Some(loopback), &none));
        options.http.trust_local_repository_agent = false;
        assert!(!local_agent(&options, &post, "/v2/repository/index", Some(loopback), &none));
    }
}
