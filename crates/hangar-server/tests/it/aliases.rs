//! Served-name aliases: a model listed with `aliases` answers to each of them, one with `/`
//! included (KServe's `publishers/<ns>/models/<name>`): in request bodies, percent-encoded
//! (`%2F`) in every route family's paths (admin, OpenAI, v2 over HTTP and gRPC), in the
//! Lemonade routes, and in `/v1/models`; everything it does is done to the model itself.

use hangar_server::HangarService;
use hangar_server::grpc::proto::ModelReadyRequest;
use hangar_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use http::Method;
use serde_json::{Value, json};

use crate::support::{call, server};

const ALIAS: &str = "publishers/default/models/chat";
const ENCODED: &str = "publishers%2Fdefault%2Fmodels%2Fchat";

fn service() -> HangarService {
    server()
        .settings(json!({ "auto_load": true }))
        .models(json!({
            "chat": { "backend": "stub", "aliases": [ALIAS, "chat-latest"] },
            "other": { "backend": "stub" },
        }))
        .build()
}

fn ids(list: &Value) -> Vec<&str> {
    list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn an_alias_with_a_slash_answers_in_bodies_and_encoded_paths_as_the_model_itself() {
    let s = service();
    // A body naming the alias: auto-loads the model and is answered by it.
    let chat = json!({ "model": ALIAS, "messages": [{ "role": "user", "content": "hi" }] });
    let (status, answer) = call(&s, Method::POST, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{answer}");
    let (status, row) = call(&s, Method::GET, &format!("/v1/admin/models/{ENCODED}"), "").await;
    assert_eq!((status, row["name"].as_str()), (200, Some("chat")), "{row}");
    assert_eq!(row["runtime_state"], "loaded", "{row}");

    // Admin control through the encoded path acts on the model.
    let unload = format!("/v1/admin/models/{ENCODED}/unload");
    assert_eq!(call(&s, Method::POST, &unload, json!({})).await.0, 200);
    let (_, row) = call(&s, Method::GET, "/v1/admin/models/chat", "").await;
    assert_eq!(row["runtime_state"], "unloaded", "{row}");

    // v2 over HTTP: the repository load and readiness.
    let load = format!("/v2/repository/models/{ENCODED}/load");
    assert_eq!(call(&s, Method::POST, &load, json!({})).await.0, 200);
    assert_eq!(call(&s, Method::GET, &format!("/v2/models/{ENCODED}/ready"), "").await.0, 200);

    // /v1/models lists each alias as a model; one alias is found by its own id.
    let (status, list) = call(&s, Method::GET, "/v1/models", "").await;
    assert_eq!(status, 200);
    assert_eq!(ids(&list), ["chat", ALIAS, "chat-latest", "other"]);
    let (status, one) = call(&s, Method::GET, &format!("/v1/models/{ENCODED}"), "").await;
    assert_eq!((status, one["id"].as_str()), (200, Some(ALIAS)), "{one}");

    // Lemonade's routes take it in their bodies.
    let unload = json!({ "model_name": "chat-latest" });
    assert_eq!(call(&s, Method::POST, "/api/v1/unload", unload).await.0, 200);
    let load = json!({ "model_name": ALIAS });
    let (status, answer) = call(&s, Method::POST, "/api/v1/load", load).await;
    assert_eq!(status, 200, "{answer}");

    // An unknown name is still unknown, encoded or not.
    let (status, answer) = call(&s, Method::GET, "/v1/admin/models/publishers%2Fnope", "").await;
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("unknown_model")));
}

#[tokio::test]
async fn grpc_model_ready_answers_for_an_alias() {
    let s = service();
    assert_eq!(call(&s, Method::POST, "/v1/admin/models/chat/load", json!({})).await.0, 200);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::grpc::serve(listener, s.clone(), std::future::pending()));
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let ready = |name: &str| ModelReadyRequest { name: name.into(), version: String::new() };
    assert!(client.model_ready(ready(ALIAS)).await.unwrap().into_inner().ready);
    let unknown = client.model_ready(ready("publishers/x")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
}
