//! The trusted local agent (`http.trust_local_repository_agent`): with the setting on, a
//! loopback peer calls the v2 repository index, load and unload without the admin key (as
//! KServe's model agent does from its sidecar), over HTTP and gRPC; the same calls from
//! another peer, through a proxy, without a known peer, or on a wide listener that does not
//! check `Host` need the key, and so does every other admin route from loopback. Keyless,
//! the agent touches only the repository folder's models: never a configured, pinned or
//! leased one, never with an override patch, and it reads no other model's error text.

use hangar_server::HangarService;
use hangar_server::grpc::proto::RepositoryIndexRequest;
use hangar_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use http::Method;
use serde_json::json;

use crate::support::{request, server};

const KEY: &str = "admin-key";

/// A repository folder holding the model `folder` (and `broken`, whose definition does not
/// hold), served from `defaults`.
fn repository(label: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("hangar-agent-{label}-{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("folder")).unwrap();
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    std::fs::write(dir.join("broken/hangar.json"), r#"{"pinned": true}"#).unwrap();
    dir
}

fn service_with(trusted: bool, label: &str, defaults: serde_json::Value) -> HangarService {
    server()
        .settings(json!({
            "http": { "trust_local_repository_agent": trusted },
            "max_loaded_models": { "llm": 4 },
            "model_repository": repository(label),
            "model_repository_defaults": defaults,
        }))
        .models(json!({
            "chat": { "backend": "stub" },
            "fails": { "backend": "stub", "stub": { "fail_load": "the engine says: secret path /srv/x" } },
        }))
        .admin_key(KEY)
        .build()
}

fn service(trusted: bool) -> HangarService {
    service_with(trusted, &format!("t{trusted}"), json!({ "backend": "stub" }))
}

/// The status of `method path` with `{}` from `peer` (none: no peer known), with `headers`.
async fn status(
    s: &HangarService,
    method: Method,
    path: &str,
    peer: Option<&str>,
    headers: &[(&str, &str)],
) -> u16 {
    let call = request(method, path).headers(headers).body(json!({}));
    let call = match peer {
        Some(peer) => call.from(peer),
        None => call,
    };
    call.send(s).await.status
}

const AGENT_CALLS: [&str; 3] = [
    "/v2/repository/index",
    "/v2/repository/models/folder/load",
    "/v2/repository/models/folder/unload",
];

#[tokio::test]
async fn a_loopback_peer_calls_the_repository_without_the_key_and_nothing_else() {
    let s = service(true);
    for peer in ["127.0.0.1:4000", "[::1]:4000", "[::ffff:127.0.0.1]:4000"] {
        for path in AGENT_CALLS {
            assert_eq!(status(&s, Method::POST, path, Some(peer), &[]).await, 200, "{peer} {path}");
        }
    }
    // Another peer, a proxied request, or one whose peer is unknown: the key is needed.
    let proxied: &[(&str, &str)] = &[("x-forwarded-for", "203.0.113.9")];
    let forwarded: &[(&str, &str)] = &[("forwarded", "for=203.0.113.9")];
    for path in AGENT_CALLS {
        for (peer, headers) in [
            (Some("10.0.0.5:4000"), &[][..]),
            (Some("[2001:db8::1]:4000"), &[][..]),
            (Some("127.0.0.1:4000"), proxied),
            (Some("127.0.0.1:4000"), forwarded),
            (None, &[][..]),
        ] {
            let got = status(&s, Method::POST, path, peer, headers).await;
            assert_eq!(got, 401, "{peer:?} {headers:?} {path}");
        }
    }
    // Every other admin route, from loopback, still needs the key.
    let doc = request(Method::GET, "/openapi.json").send(&s).await.body;
    let mut others = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let is_admin = op.get("security").is_some_and(|s| s == &json!([{ "bearerAuth": [] }]));
            let path = path.replace("{name}", "folder").replace("{id}", "lease");
            if !is_admin || AGENT_CALLS.contains(&path.as_str()) {
                continue;
            }
            let method: Method = method.to_uppercase().parse().unwrap();
            let got = status(&s, method.clone(), &path, Some("127.0.0.1:4000"), &[]).await;
            assert_eq!(got, 401, "{method} {path}");
            others += 1;
        }
    }
    assert!(others >= 20, "only {others} other admin routes checked");
}

#[tokio::test]
async fn the_setting_is_off_by_default() {
    let s = service(false);
    for path in AGENT_CALLS {
        assert_eq!(
            status(&s, Method::POST, path, Some("127.0.0.1:4000"), &[]).await,
            401,
            "{path}"
        );
    }
}

#[tokio::test]
async fn over_grpc_too() {
    for (trusted, allowed) in [(true, true), (false, false)] {
        let s = service(trusted);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(hangar_server::grpc::serve(listener, s, std::future::pending()));
        let mut client =
            GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
        let index = client.repository_index(RepositoryIndexRequest::default()).await;
        match (allowed, index) {
            (true, Ok(index)) => {
                let names: Vec<String> =
                    index.into_inner().models.into_iter().map(|m| m.name).collect();
                assert_eq!(names, ["chat", "fails", "broken", "folder"]);
            }
            (false, Err(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
            (allowed, answer) => panic!("trusted {trusted}, allowed {allowed}: {answer:?}"),
        }
    }
}

/// `method path` with `body` as the agent sends it (loopback, no key), or with the key.
async fn agent(s: &HangarService, path: &str, body: serde_json::Value, key: bool) -> (u16, String) {
    let call = request(Method::POST, path).from("127.0.0.1:4000").body(body);
    let call = if key { call.bearer(KEY) } else { call };
    let answer = call.send(s).await;
    (answer.status, answer.text())
}

#[tokio::test]
async fn keyless_the_agent_touches_only_repository_models_never_held_ones_nor_overrides() {
    let s = service(true);
    let load = |m: &str| format!("/v2/repository/models/{m}/load");
    let unload = |m: &str| format!("/v2/repository/models/{m}/unload");
    // A configured model: neither loaded nor unloaded without the key; with it, both.
    let (status, text) = agent(&s, &load("chat"), json!({}), false).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("defined by the config"), "{text}");
    assert_eq!(agent(&s, &load("chat"), json!({}), true).await.0, 200);
    assert_eq!(agent(&s, &unload("chat"), json!({}), false).await.0, 403);
    assert_eq!(crate::support::state(&s, "chat"), "loaded", "a refused unload changes nothing");
    // An override patch needs the key, even on a repository model.
    let patch = json!({ "parameters": { "config": { "replicas": 1 } } });
    let (status, text) = agent(&s, &load("folder"), patch.clone(), false).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("parameters.config is refused"), "{text}");
    assert_eq!(crate::support::state(&s, "folder"), "unloaded", "nothing loaded");
    assert_eq!(agent(&s, &load("folder"), patch, true).await.0, 200);
    // A leased repository model: the agent's unload is refused and the lease stays.
    let lease = request(Method::POST, "/v1/admin/models/folder/leases")
        .bearer(KEY)
        .body(json!({ "owner": "job-7", "ttl_seconds": 600 }))
        .send(&s)
        .await;
    assert_eq!(lease.status, 200, "{}", lease.text());
    let (status, text) = agent(&s, &unload("folder"), json!({}), false).await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("is leased"), "{text}");
    let row = request(Method::GET, "/v1/admin/models/folder").bearer(KEY).send(&s).await;
    assert_eq!(row.body["runtime_state"], "loaded");
    assert_eq!(row.body["leases"][0]["owner"], "job-7", "the lease was not revoked");
    // Released, the agent may unload it.
    let id = lease.body["lease"]["id"].as_str().unwrap();
    let path = format!("/v1/admin/models/folder/leases/{id}");
    assert_eq!(request(Method::DELETE, &path).bearer(KEY).send(&s).await.status, 200);
    assert_eq!(agent(&s, &unload("folder"), json!({}), false).await.0, 200);
    assert_eq!(crate::support::state(&s, "folder"), "unloaded");
}

#[tokio::test]
async fn a_pinned_repository_model_is_the_key_holders_alone() {
    let s = service_with(true, "pinned", json!({ "backend": "stub", "pinned": true }));
    let (status, text) = agent(&s, "/v2/repository/models/folder/load", json!({}), false).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("is pinned"), "{text}");
    assert_eq!(agent(&s, "/v2/repository/models/folder/load", json!({}), true).await.0, 200);
    assert_eq!(agent(&s, "/v2/repository/models/folder/unload", json!({}), false).await.0, 403);
}

#[tokio::test]
async fn keyless_the_agent_reads_the_reasons_of_repository_models_only() {
    let s = service(true);
    assert_eq!(agent(&s, "/v2/repository/models/fails/load", json!({}), true).await.0, 400);
    let reasons = |rows: serde_json::Value| -> Vec<(String, String)> {
        let rows = rows.as_array().unwrap().iter();
        let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap().to_owned();
        rows.map(|r| (field(r, "name"), field(r, "reason"))).collect()
    };
    let index = |key: bool| {
        let call = request(Method::POST, "/v2/repository/index").from("127.0.0.1:4000");
        let call = if key { call.bearer(KEY) } else { call };
        call.body(json!({})).send(&s)
    };
    let keyless = reasons(index(false).await.body);
    let keyed = reasons(index(true).await.body);
    let of = |rows: &[(String, String)], name: &str| {
        rows.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone()).unwrap()
    };
    assert!(of(&keyed, "fails").contains("secret path"), "{keyed:?}");
    assert_eq!(of(&keyless, "fails"), "load failed", "a configured model's error is not shown");
    let broken = of(&keyless, "broken");
    assert!(broken.contains("`pinned` is the operator's"), "a folder's own reason is: {broken}");
}

#[tokio::test]
async fn on_a_wide_listener_the_agent_needs_hosts_checked() {
    let wide = |hosts: Vec<String>| {
        server()
            .settings(json!({ "http": { "trust_local_repository_agent": true } }))
            .admin_key(KEY)
            .options(move |o| {
                o.loopback_listener = false;
                o.http.allowed_hosts = hosts;
            })
            .build()
    };
    let index = |s: HangarService| async move {
        let call = request(Method::POST, "/v2/repository/index").from("127.0.0.1:4000");
        call.header("host", "hangar.internal").body(json!({})).send(&s).await.status
    };
    // A rebound name could pass for the agent here: the key is needed.
    assert_eq!(index(wide(Vec::new())).await, 401);
    assert_eq!(index(wide(vec!["hangar.internal".into()])).await, 200);
}
