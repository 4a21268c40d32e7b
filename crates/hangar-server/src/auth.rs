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
/// inference route.
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
    let Some(given) = bearer(headers) else {
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

/// Whether the caller may see what the open routes (`/api/v1/health`,
/// `/v2/models/{name}/ready`) show only to key holders — model paths, engine URLs, error
/// texts: always while no key is configured, else with a valid inference or admin key.
pub(crate) fn discloses(options: &ServerOptions, headers: &HeaderMap) -> bool {
    let keys = options.inference_api_keys.iter().chain(options.admin_api_key.as_slice());
    if options.admin_api_key.is_none() && options.inference_api_keys.is_empty() {
        return true;
    }
    bearer(headers).is_some_and(|given| matches_any(keys, given))
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
}
