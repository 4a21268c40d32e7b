//! The web workbench: `/ui` and its two assets, embedded in the binary (no CDN, no build
//! step). The page uses only the public APIs; it needs no key to be fetched, and asks the
//! browser user for the admin key when an API call is refused.

use http::{HeaderValue, StatusCode, header};

use crate::body::{Response, text_response};
use crate::error::{ApiError, HttpCode};
use crate::router::Ctx;

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");
const FAVICON: &str = include_str!("../ui/favicon.svg");

/// Only this server's own scripts, styles and API; no inline script or style attributes.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, text: &'static str) -> Response {
    let mut response = text_response(StatusCode::OK, content_type, text.to_owned());
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// `GET /ui`: the page.
pub(crate) async fn index(_ctx: Ctx) -> Result<Response, ApiError> {
    Ok(asset("text/html; charset=utf-8", INDEX))
}

/// `GET /ui/{file}`: `app.js`, `app.css` or `favicon.svg`.
pub(crate) async fn file(ctx: Ctx) -> Result<Response, ApiError> {
    match ctx.name() {
        "app.js" => Ok(asset("text/javascript; charset=utf-8", APP_JS)),
        "app.css" => Ok(asset("text/css; charset=utf-8", APP_CSS)),
        "favicon.svg" => Ok(asset("image/svg+xml", FAVICON)),
        other => Err(ApiError::new(HttpCode::NotFound, format!("no workbench file {other:?}"))),
    }
}
