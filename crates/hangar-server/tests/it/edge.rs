//! The HTTP edge against a web page in a local browser: cross-origin and rebinding requests
//! are refused before they change anything, configured origins and hosts pass, CORS
//! preflights are answered only for allowed origins, `HEAD` answers `GET` routes, and the
//! open routes show no paths, engine URLs or error texts to callers without a key.

use hangar_config::Secret;
use hangar_server::{HangarService, ServerOptions};
use serde_json::{Value, json};

use crate::support::{Answer, request, server, state};

fn service_with(settings: Value, edit: impl FnOnce(&mut ServerOptions) + 'static) -> HangarService {
    server()
        .models(json!({
            "chat": { "backend": "stub", "model_path": "/models/secret/chat.gguf", "stub": { "reply": "hi" } },
            "broken": { "backend": "stub", "stub": { "fail_load": "cannot open /models/secret/broken.gguf" } }
        }))
        .settings(settings)
        .options(edit)
        .build()
}

fn service() -> HangarService {
    service_with(json!({}), |_| {})
}

async fn send(
    s: &HangarService,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    request(method, path).headers(headers).body(body).send(s).await
}

async fn loaded(s: &HangarService) {
    let a =
        send(s, "POST", "/v1/admin/models/chat/load", &[("host", "localhost:8080")], "{}").await;
    assert_eq!(a.status, 200, "{}", a.body);
}

const HOST: (&str, &str) = ("host", "localhost:8080");
const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test]
async fn a_cross_site_form_post_cannot_unload_a_model() {
    let s = service();
    loaded(&s).await;
    // What a page on another site sends for a no-preflight ("simple") request.
    let attacks: [&[(&str, &str)]; 4] = [
        &[HOST, TEXT, ("origin", "https://evil.example"), ("sec-fetch-site", "cross-site")],
        &[HOST, TEXT, ("origin", "null")],
        &[HOST, TEXT, ("origin", "http://localhost:3000")],
        &[HOST, TEXT, ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")],
    ];
    for headers in attacks {
        let a = send(&s, "POST", "/v1/admin/models/chat/unload", headers, "").await;
        assert_eq!(
            (a.status, a.body["error"]["code"].as_str()),
            (403, Some("origin_not_allowed")),
            "{headers:?}"
        );
        assert_eq!(state(&s, "chat"), "loaded", "{headers:?} changed nothing");
    }
    // The server's own page (same origin) and a script without Origin still work.
    let own = [HOST, ("origin", "http://localhost:8080"), ("content-type", "application/json")];
    let a = send(&s, "POST", "/v1/admin/models/chat/unload", &own, "{}").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.headers.get("access-control-allow-origin").is_none(), "same origin needs no CORS");
    loaded(&s).await;
    let a = send(&s, "POST", "/v1/admin/models/chat/unload", &[HOST, TEXT], "").await;
    assert_eq!(a.status, 200, "curl-like clients keep working with any content type: {}", a.body);
}

#[tokio::test]
async fn a_rebinding_host_is_refused_on_loopback_and_allowed_hosts_pass() {
    let s = service_with(json!({ "http": { "allowed_hosts": ["hangar.lan"] } }), |_| {});
    loaded(&s).await;
    for host in ["rebind.evil.example", "rebind.evil.example:8080", "hangar.lan.evil.example"] {
        let a = send(&s, "POST", "/v1/admin/models/chat/unload", &[("host", host)], "").await;
        assert_eq!(
            (a.status, a.body["error"]["code"].as_str()),
            (403, Some("host_not_allowed")),
            "{host}"
        );
        assert_eq!(state(&s, "chat"), "loaded");
    }
    // The KServe v2 routes refuse in their own envelope.
    let a = send(&s, "GET", "/v2/health/ready", &[("host", "rebind.evil.example")], "").await;
    assert_eq!(a.status, 403);
    assert!(a.body["error"].as_str().unwrap().contains("rebind.evil.example"), "{}", a.body);
    for host in
        ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "ui.localhost", "hangar.lan:8080"]
    {
        let a = send(&s, "GET", "/v1/admin/models/chat", &[("host", host)], "").await;
        assert_eq!(a.status, 200, "{host}: {}", a.body);
    }
    // Beyond loopback with no allowed_hosts, any Host is served (a gateway, a probe).
    let open = service_with(json!({}), |o| o.loopback_listener = false);
    let a = send(&open, "GET", "/healthz", &[("host", "hangar.default.svc:8080")], "").await;
    assert_eq!(a.status, 200);
    // Beyond loopback with allowed_hosts, only those (and addresses) are.
    let gated = service_with(json!({ "http": { "allowed_hosts": [".svc"] } }), |o| {
        o.loopback_listener = false
    });
    assert_eq!(
        send(&gated, "GET", "/healthz", &[("host", "hangar.default.svc")], "").await.status,
        200
    );
    assert_eq!(send(&gated, "GET", "/healthz", &[("host", "10.1.2.3:8080")], "").await.status, 200);
    assert_eq!(send(&gated, "GET", "/healthz", &[("host", "evil.example")], "").await.status, 403);
}

#[tokio::test]
async fn configured_origins_get_cors_and_preflights_only_for_them() {
    let ui = "https://ui.example.com";
    let s = service_with(json!({ "http": { "allowed_origins": [ui] } }), |_| {});
    let preflight = |origin: &'static str| {
        [
            HOST,
            ("origin", origin),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization, content-type"),
        ]
    };
    let a = send(&s, "OPTIONS", "/v1/chat/completions", &preflight(ui), "").await;
    assert_eq!(a.status, 204);
    assert_eq!(a.headers["access-control-allow-origin"], ui);
    assert!(a.headers["access-control-allow-headers"].to_str().unwrap().contains("authorization"));
    assert!(a.headers["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    let a =
        send(&s, "OPTIONS", "/v1/chat/completions", &preflight("https://evil.example"), "").await;
    assert_eq!((a.status, a.body["error"]["code"].as_str()), (403, Some("origin_not_allowed")));
    assert!(a.headers.get("access-control-allow-origin").is_none());

    let a = send(&s, "GET", "/v1/models", &[HOST, ("origin", ui)], "").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.headers["access-control-allow-origin"], ui);
    assert_eq!(a.headers["vary"], "Origin");
    // An error answer to an allowed origin carries CORS too, so its page can read it.
    let a = send(&s, "GET", "/v1/admin/models/nope", &[HOST, ("origin", ui)], "").await;
    assert_eq!((a.status, a.headers["access-control-allow-origin"].to_str().unwrap()), (404, ui));
}

#[tokio::test]
async fn head_answers_get_routes_without_a_body() {
    let s = service();
    let get = send(&s, "GET", "/v1/admin/models", &[HOST], "").await;
    let head = send(&s, "HEAD", "/v1/admin/models", &[HOST], "").await;
    assert_eq!((head.status, head.raw.len()), (200, 0));
    assert_eq!(head.headers["content-length"], get.raw.len().to_string().as_str());
    assert_eq!(head.headers["content-type"], "application/json");
    let a = send(&s, "DELETE", "/healthz", &[HOST], "").await;
    assert_eq!((a.status, a.headers["allow"].to_str().unwrap()), (405, "GET, HEAD"));
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let s = service_with(json!({}), |o| o.admin_api_key = Some(Secret::new("k1")));
    for value in ["Bearer k1", "bearer k1", "BEARER  k1"] {
        let a = send(&s, "GET", "/v1/admin/models", &[HOST, ("authorization", value)], "").await;
        assert_eq!(a.status, 200, "{value}");
    }
    let a = send(&s, "GET", "/v1/admin/models", &[HOST, ("authorization", "Basic k1")], "").await;
    assert_eq!(a.status, 401);
}

#[tokio::test]
async fn open_routes_disclose_no_paths_or_errors_without_a_key_while_keys_are_set() {
    let keyed = |o: &mut ServerOptions| {
        o.admin_api_key = Some(Secret::new("admin"));
        o.inference_api_keys = vec![Secret::new("inf")];
    };
    let s = service_with(json!({}), keyed);
    let admin = ("authorization", "Bearer admin");
    let a = send(&s, "POST", "/v1/admin/models/broken/load", &[HOST, admin], "{}").await;
    assert_eq!(a.status, 400, "{}", a.body);
    let a = send(&s, "POST", "/v1/admin/models/chat/load", &[HOST, admin], "{}").await;
    assert_eq!(a.status, 200, "{}", a.body);

    for key in [None, Some("Bearer wrong")] {
        let mut headers = vec![HOST];
        headers.extend(key.map(|k| ("authorization", k)));
        let health = send(&s, "GET", "/api/v1/health", &headers, "").await;
        assert_eq!(health.status, 200);
        let text = String::from_utf8_lossy(&health.raw);
        assert!(!text.contains("/models/secret"), "{key:?}: {text}");
        assert_eq!(health.body["model_loaded"], "chat", "names stay");
        assert_eq!(health.body["all_models_loaded"][0]["checkpoint"], Value::Null);
        let ready = send(&s, "GET", "/v2/models/broken/ready", &headers, "").await;
        assert_eq!(ready.status, 400);
        let text = String::from_utf8_lossy(&ready.raw);
        assert!(text.contains("failed") && !text.contains("/models/secret"), "{key:?}: {text}");
        for path in ["/metrics", "/readyz", "/v2/health/ready", "/v2/models/broken"] {
            let a = send(&s, "GET", path, &headers, "").await;
            let text = String::from_utf8_lossy(&a.raw);
            assert!(!text.contains("/models/secret"), "{path}: {text}");
        }
    }
    // Key holders (inference or admin) see the details.
    for key in ["Bearer inf", "Bearer admin"] {
        let health = send(&s, "GET", "/api/v1/health", &[HOST, ("authorization", key)], "").await;
        assert_eq!(health.body["checkpoint_loaded"], "/models/secret/chat.gguf", "{key}");
        let ready =
            send(&s, "GET", "/v2/models/broken/ready", &[HOST, ("authorization", key)], "").await;
        assert!(
            String::from_utf8_lossy(&ready.raw).contains("/models/secret/broken.gguf"),
            "{key}"
        );
    }
    // Without keys configured, everything is shown to everyone, as before.
    let open = service();
    loaded(&open).await;
    let health = send(&open, "GET", "/api/v1/health", &[HOST], "").await;
    assert_eq!(health.body["checkpoint_loaded"], "/models/secret/chat.gguf");
}

#[tokio::test]
async fn metrics_take_the_inference_key_when_the_operator_asks() {
    let keyed = |o: &mut ServerOptions| o.inference_api_keys = vec![Secret::new("inf")];
    let open = service_with(json!({}), keyed);
    assert_eq!(send(&open, "GET", "/metrics", &[HOST], "").await.status, 200);
    let gated = service_with(json!({ "http": { "metrics_require_key": true } }), keyed);
    assert_eq!(send(&gated, "GET", "/metrics", &[HOST], "").await.status, 401);
    let a = send(&gated, "GET", "/metrics", &[HOST, ("authorization", "Bearer inf")], "").await;
    assert_eq!(a.status, 200);
    let doc = send(&gated, "GET", "/openapi.json", &[HOST], "").await;
    let security = &doc.body["paths"]["/metrics"]["get"]["security"];
    assert!(security.is_array() && !security.as_array().unwrap().is_empty(), "{security}");
}
