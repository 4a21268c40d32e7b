//! KServe v2 / Triton over real gRPC: `hangar_server::grpc::serve` on a loopback port, driven
//! by the tonic client generated from the same `.proto`, over a manager on the stub backend.
//! Every answer is compared with what the HTTP route it mirrors says for the same case —
//! states, messages, and the status each error maps to.

use std::collections::HashMap;

use hangar_config::BackendKind;
use hangar_server::HangarService;
use hangar_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use hangar_server::grpc::proto::model_repository_parameter::ParameterChoice;
use hangar_server::grpc::proto::*;
use http::Method;
use serde_json::{Value, json};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::{call, server};

type Client = GrpcInferenceServiceClient<Channel>;

/// The HTTP service and a gRPC client of the same service on a loopback port.
async fn start(admin_key: Option<&str>) -> (HangarService, Client) {
    let service = server()
        .settings(json!({ "max_loaded_models": { "llm": 8 } }))
        .models(json!({
            "chat": { "backend": "stub", "enabled": true },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/q.gguf", "replica_max": 2 },
            "spare": { "backend": "stub" },
            "broken": { "backend": "stub", "stub": { "fail_load": "boom" } },
            "slow": { "backend": "stub", "stub": { "load_delay_ms": 1500 } },
        }))
        .stub_kinds([BackendKind::LlamaCpp])
        .admin_key(admin_key)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::grpc::serve(listener, service.clone(), std::future::pending()));
    let client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    (service, client)
}

fn string(s: &str) -> ModelRepositoryParameter {
    ModelRepositoryParameter { parameter_choice: Some(ParameterChoice::StringParam(s.into())) }
}

fn load(name: &str, parameters: &[(&str, ModelRepositoryParameter)]) -> RepositoryModelLoadRequest {
    let parameters: HashMap<_, _> =
        parameters.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    RepositoryModelLoadRequest {
        repository_name: String::new(),
        model_name: name.into(),
        parameters,
    }
}

fn unload(name: &str) -> RepositoryModelUnloadRequest {
    RepositoryModelUnloadRequest { model_name: name.into(), ..Default::default() }
}

/// The error's gRPC code, message and `hangar-error-code`.
fn parts(status: &Status) -> (Code, &str, &str) {
    let code = status.metadata().get("hangar-error-code").map_or("", |v| v.to_str().unwrap());
    (status.code(), status.message(), code)
}

async fn index(client: &mut Client, ready: bool) -> Vec<(String, String, String)> {
    let request = RepositoryIndexRequest { repository_name: String::new(), ready };
    let models = client.repository_index(request).await.unwrap().into_inner().models;
    models.into_iter().map(|m| (m.name, m.state, m.reason)).collect()
}

async fn http_index(s: &HangarService, ready: bool) -> Vec<(String, String, String)> {
    let (status, body) =
        call(s, Method::POST, "/v2/repository/index", json!({ "ready": ready })).await;
    assert_eq!(status, 200);
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    body.as_array()
        .unwrap()
        .iter()
        .map(|m| (text(&m["name"]), text(&m["state"]), text(&m["reason"])))
        .collect()
}

#[tokio::test]
async fn health_and_metadata_answer_as_the_http_routes() {
    let (s, mut c) = start(None).await;
    assert!(c.server_live(ServerLiveRequest {}).await.unwrap().into_inner().live);
    assert!(
        !c.server_ready(ServerReadyRequest {}).await.unwrap().into_inner().ready,
        "chat is enabled, not loaded"
    );
    let meta = c.server_metadata(ServerMetadataRequest {}).await.unwrap().into_inner();
    let (_, http_meta) = call(&s, Method::GET, "/v2", "").await;
    assert_eq!(
        (meta.name.as_str(), meta.version.as_str()),
        (http_meta["name"].as_str().unwrap(), http_meta["version"].as_str().unwrap())
    );
    assert_eq!(meta.extensions, ["model_repository"]);

    let ready = |name: &str, version: &str| ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    assert!(!c.model_ready(ready("chat", "")).await.unwrap().into_inner().ready);
    c.repository_model_load(load("chat", &[])).await.unwrap();
    assert!(c.model_ready(ready("chat", "1")).await.unwrap().into_inner().ready);
    assert!(c.server_ready(ServerReadyRequest {}).await.unwrap().into_inner().ready);

    let metadata = |name: &str| ModelMetadataRequest { name: name.into(), version: String::new() };
    let gguf = c.model_metadata(metadata("gguf")).await.unwrap().into_inner();
    assert_eq!(
        (gguf.name.as_str(), gguf.versions.as_slice(), gguf.platform.as_str()),
        ("gguf", &["1".to_owned()][..], "llama_cpp")
    );
    let (status, http_gguf) = call(&s, Method::GET, "/v2/models/gguf", "").await;
    assert_eq!((status, http_gguf["platform"].as_str()), (200, Some("llama_cpp")));

    // Unknown models and versions: NOT_FOUND with the HTTP message.
    let err = c.model_metadata(metadata("nope")).await.unwrap_err();
    let (_, http_err) = call(&s, Method::GET, "/v2/models/nope", "").await;
    assert_eq!(parts(&err), (Code::NotFound, http_err["error"].as_str().unwrap(), "unknown_model"));
    let err = c.model_ready(ready("chat", "2")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("no version '2'"), "{err:?}");
}

#[tokio::test]
async fn the_repository_index_load_and_unload_match_http() {
    let (s, mut c) = start(None).await;
    // A failed load: INTERNAL (as Triton answers), the HTTP message, the model failed.
    let err = c.repository_model_load(load("broken", &[])).await.unwrap_err();
    let (_, http_err) = call(&s, Method::POST, "/v2/repository/models/broken/load", "").await;
    assert_eq!(parts(&err), (Code::Internal, http_err["error"].as_str().unwrap(), "load_failed"));
    c.repository_model_load(load("spare", &[])).await.unwrap();

    let all = index(&mut c, false).await;
    assert_eq!(all, http_index(&s, false).await, "the same index as HTTP");
    let state = |name: &str| all.iter().find(|m| m.0 == name).map(|m| (m.1.as_str(), m.2.as_str()));
    assert_eq!(state("spare"), Some(("READY", "")));
    assert_eq!(state("gguf"), Some(("UNAVAILABLE", "unloaded")));
    assert!(state("broken").unwrap().1.contains("boom"), "{all:?}");
    let ready = index(&mut c, true).await;
    assert_eq!(ready.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["spare"]);
    assert_eq!(ready, http_index(&s, true).await);

    // A config parameter reloads with the override patch; file: parameters are refused.
    c.repository_model_load(load(
        "gguf",
        &[("config", string(r#"{"name": "gguf", "replicas": 2}"#))],
    ))
    .await
    .unwrap();
    let (_, row) = call(&s, Method::GET, "/v1/admin/models/gguf", "").await;
    assert_eq!(
        (row["runtime_state"].as_str(), row["loaded_replicas"].as_u64()),
        (Some("loaded"), Some(2))
    );
    let file = ModelRepositoryParameter {
        parameter_choice: Some(ParameterChoice::BytesParam(vec![1, 2])),
    };
    let err = c
        .repository_model_load(load(
            "gguf",
            &[("config", string("{}")), ("file:1/model.onnx", file)],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("file:1/model.onnx"), "{err:?}");
    let err =
        c.repository_model_load(load("gguf", &[("config", string("not json"))])).await.unwrap_err();
    let body = json!({ "parameters": { "config": "not json" } }).to_string();
    let (status, http_err) = call(&s, Method::POST, "/v2/repository/models/gguf/load", &body).await;
    assert_eq!(status, 400);
    assert_eq!(
        parts(&err),
        (Code::InvalidArgument, http_err["error"].as_str().unwrap(), "invalid_request")
    );
    let err = c.repository_model_load(load("nope", &[])).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Unload, with unload_dependents accepted; a non-boolean refused.
    let mut dependents = unload("gguf");
    let flag =
        ModelRepositoryParameter { parameter_choice: Some(ParameterChoice::BoolParam(true)) };
    dependents.parameters.insert("unload_dependents".into(), flag);
    c.repository_model_unload(dependents).await.unwrap();
    let ready = ModelReadyRequest { name: "gguf".into(), version: String::new() };
    assert!(!c.model_ready(ready).await.unwrap().into_inner().ready);
    let mut bad = unload("spare");
    bad.parameters.insert("unload_dependents".into(), string("yes"));
    assert_eq!(c.repository_model_unload(bad).await.unwrap_err().code(), Code::InvalidArgument);
    let other = RepositoryIndexRequest { repository_name: "models".into(), ready: false };
    assert_eq!(c.repository_index(other).await.unwrap_err().code(), Code::NotFound);

    // A state conflict: FAILED_PRECONDITION (unloading a model while it loads).
    let mut loader = c.clone();
    let loading =
        tokio::spawn(async move { loader.repository_model_load(load("slow", &[])).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let err = c.repository_model_unload(unload("slow")).await.unwrap_err();
    assert_eq!(parts(&err).0, Code::FailedPrecondition, "{err:?}");
    assert_eq!(parts(&err).2, "state_conflict");
    loading.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_admin_key_guards_the_repository_rpcs_as_it_guards_http() {
    let (_, mut c) = start(Some("s3cret")).await;
    let with = |key: Option<&str>| {
        let mut request = tonic::Request::new(RepositoryIndexRequest::default());
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {key}").parse().unwrap());
        }
        request
    };
    let err = c.repository_index(with(None)).await.unwrap_err();
    assert_eq!(parts(&err).0, Code::Unauthenticated, "{err:?}");
    let err = c.repository_index(with(Some("wrong"))).await.unwrap_err();
    assert_eq!(parts(&err).0, Code::PermissionDenied, "{err:?}");
    assert!(
        !c.repository_index(with(Some("s3cret"))).await.unwrap().into_inner().models.is_empty()
    );
    let err = c.repository_model_load(load("spare", &[])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // Health and metadata are open, as over HTTP.
    assert!(c.server_live(ServerLiveRequest {}).await.unwrap().into_inner().live);
    assert!(c.server_metadata(ServerMetadataRequest {}).await.is_ok());
}

#[tokio::test]
async fn unserved_rpcs_name_the_http_route_to_use() {
    let (_, mut c) = start(None).await;
    let err = c.model_infer(Unserved {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    assert!(err.message().contains("/v1/chat/completions"), "{err:?}");
    let err = c.model_config(Unserved {}).await.unwrap_err();
    assert!(err.message().contains("/v1/admin/models/{name}"), "{err:?}");
    let err = c.system_shared_memory_status(Unserved {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn a_message_over_the_body_bound_or_not_protobuf_is_the_callers_error() {
    let service = server()
        .settings(json!({ "max_request_body_bytes": 4096 }))
        .models(json!({ "chat": { "backend": "stub" } }))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::grpc::serve(listener, service.clone(), std::future::pending()));
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    // One byte over the bound, then at it (a name that is no model).
    let named = |bytes: usize| unload(&"m".repeat(bytes));
    let over = client.repository_model_unload(named(4094)).await.unwrap_err();
    let (code, message, hangar) = parts(&over);
    assert_eq!((code, hangar), (Code::ResourceExhausted, "payload_too_large"), "{message}");
    assert!(message.contains("4096"), "{message}");
    let at = client.repository_model_unload(named(4093)).await.unwrap_err();
    assert_eq!(parts(&at).0, Code::NotFound, "{at:?}");

    // Bytes that are no RepositoryModelUnloadRequest: INVALID_ARGUMENT, not INTERNAL.
    let frame = [0, 0, 0, 0, 3, 0x12, 9, b'x'];
    let request = http::Request::post("/inference.GRPCInferenceService/RepositoryModelUnload")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
            &frame,
        ))))
        .unwrap();
    let answer = hangar_server::grpc::call(&service, request).await;
    let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("grpc-status"), Some("3"), "{:?}", answer.headers());
    assert_eq!(header("hangar-error-code"), Some("invalid_request"));
}
