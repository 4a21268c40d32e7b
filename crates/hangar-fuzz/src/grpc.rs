//! gRPC calls through the real KServe v2 service, in process (`hangar_server::grpc::call`,
//! the gate and decode limit `grpc::serve` runs), on the same service as the HTTP bodies.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use crate::server::HARNESS;

/// The RPCs a call may name: every one Hangar serves, one it does not, and a path outside
/// the service.
const RPCS: [&str; 10] = [
    "inference.GRPCInferenceService/ServerLive",
    "inference.GRPCInferenceService/ServerReady",
    "inference.GRPCInferenceService/ModelReady",
    "inference.GRPCInferenceService/ServerMetadata",
    "inference.GRPCInferenceService/ModelMetadata",
    "inference.GRPCInferenceService/RepositoryIndex",
    "inference.GRPCInferenceService/RepositoryModelLoad",
    "inference.GRPCInferenceService/RepositoryModelUnload",
    "inference.GRPCInferenceService/ModelInfer",
    "other.Service/ServerLive",
];

/// gRPC's status codes a call may end with: OK, and the ones Hangar's errors map to (never
/// UNKNOWN, INTERNAL or DATA_LOSS, which would be Hangar's fault; but see [`PROTOCOL`]).
const EXPECTED: [u32; 11] = [0, 1, 3, 4, 5, 8, 9, 10, 12, 14, 16];

/// The starts of the (percent-encoded) messages of the framing errors gRPC's status code
/// table makes INTERNAL (a compressed flag without an encoding, a frame cut short, a unary
/// call without its one message: a cardinality violation), as tonic answers them.
const PROTOCOL: [&str; 3] =
    ["protocol%20error:", "Unexpected%20EOF", "Missing%20request%20message"];

/// One call: the first byte picks the RPC (its low bits) and whether the rest is a
/// message to frame (high bit clear) or the request body as sent (set: any frames,
/// truncated ones, compressed flags).
///
/// Invariants: the call is answered (HTTP 200, as gRPC answers everything) within the
/// harness's patience, with a `grpc-status` among [`EXPECTED`] (or a framing error);
/// every status but OK has a message.
pub(crate) fn grpc(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let rpc = RPCS[usize::from(pick & 0x7f) % RPCS.len()];
    let body = if pick & 0x80 == 0 { frame(rest) } else { rest.to_vec() };
    let request = Request::post(format!("/{rpc}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Full::new(Bytes::from(body))))
        .expect("a request");
    HARNESS.with(|h| {
        let (status, code, message) = h.runtime.block_on(async {
            let answer = tokio::time::timeout(crate::server::PATIENCE, async {
                let response = hangar_server::grpc::call(&h.service, request).await;
                let (head, body) = response.into_parts();
                let trailers = body.collect().await.ok().and_then(|b| b.trailers().cloned());
                let field = |name: &str| {
                    let value = head.headers.get(name).or_else(|| trailers.as_ref()?.get(name));
                    value.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                };
                (head.status.as_u16(), field("grpc-status"), field("grpc-message"))
            });
            answer.await.unwrap_or_else(|_| panic!("{rpc} took longer than the patience"))
        });
        assert_eq!(status, 200, "{rpc}");
        let code: u32 =
            code.and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{rpc}: no grpc-status"));
        let framing = code == 13
            && message.as_deref().is_some_and(|m| PROTOCOL.iter().any(|p| m.starts_with(p)));
        assert!(EXPECTED.contains(&code) || framing, "{rpc} -> status {code}: {message:?}");
        if code != 0 {
            assert!(message.is_some_and(|m| !m.is_empty()), "{rpc} -> {code} without a message");
        }
    });
}

/// `message` as one uncompressed gRPC frame.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(message);
    out
}
