//! The workbench's files as the server sends them: open even when an admin key is set (the
//! page asks for the key for its API calls), with their content types, a strict content
//! security policy, and nothing fetched from anywhere but this server. The page itself is
//! driven in a real Chromium by `xtask/e2e/workbench.py`.

use hangar_server::HangarService;
use http::Method;
use serde_json::json;

use crate::support::{request, server};

fn service() -> HangarService {
    server().models(json!({ "chat": { "backend": "stub" } })).admin_key("admin-key").build()
}

async fn get(s: &HangarService, path: &str) -> (u16, http::HeaderMap, String) {
    let answer = request(Method::GET, path).send(s).await;
    let text = String::from_utf8(answer.raw.to_vec()).expect("UTF-8");
    (answer.status, answer.headers, text)
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_without_a_key_and_load_nothing_from_elsewhere() {
    let s = service();
    let mut texts = Vec::new();
    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        let (status, headers, body) = get(&s, path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(headers["content-type"], content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        texts.push(body);
    }
    let page = &texts[0];
    for asset in ["/ui/app.js", "/ui/app.css", "/ui/favicon.svg"] {
        assert!(page.contains(&format!("\"{asset}\"")), "the page links {asset}");
    }
    // No CDN and no inline script: everything comes from this server.
    for text in &texts[..3] {
        assert!(!text.contains("http://") && !text.contains("https://"), "an external URL");
    }
    assert!(!page.contains("<script>") && !page.contains(" style=\""), "inline code or style");

    let (status, _, body) = get(&s, "/ui/secrets.txt").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"not_found\""), "{body}");
    // The API behind it still wants the key.
    assert_eq!(get(&s, "/v1/admin/models").await.0, 401);
}
