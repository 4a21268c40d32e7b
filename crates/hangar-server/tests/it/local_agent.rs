//! The trusted local agent (`http.trust_local_repository_agent`): with the setting on, a
//! loopback peer calls the v2 repository index, load and unload without the admin key (as
//! KServe's model agent does from its sidecar), over HTTP and gRPC; the same calls from
//! another peer, through a proxy, or without a known peer need the key, and so does every
//! other admin route from loopback.

use hangar_server::HangarService;
use hangar_server::grpc::proto::RepositoryIndexRequest;
use hangar_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use http::Method;
use serde_json::json;

use crate::support::{request, server};

const KEY: &str = "admin-key";

fn service(trusted: bool) -> HangarService {
    server()
        .settings(json!({ "http": { "trust_local_repository_agent": trusted } }))
        .models(json!({ "chat": { "backend": "stub" } }))
        .admin_key(KEY)
        .build()
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
    "/v2/repository/models/chat/load",
    "/v2/repository/models/chat/unload",
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
            let path = path.replace("{name}", "chat").replace("{id}", "lease");
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
                assert_eq!(names, ["chat"]);
            }
            (false, Err(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
            (allowed, answer) => panic!("trusted {trusted}, allowed {allowed}: {answer:?}"),
        }
    }
}
