//! KServe v2 / Triton over gRPC: `inference.GRPCInferenceService` (`tonic`), wire-compatible
//! with Triton's clients — health, server and model metadata, and the model-repository
//! extension (index, load, unload).
//!
//! Each RPC mirrors an HTTP route of [`crate::kserve`]: it takes its auth class from that
//! route (the admin key, read from the `authorization` metadata, guards the repository RPCs
//! exactly as it guards `/v2/repository/…`) and calls the same rule function; errors become
//! gRPC statuses with the HTTP message ([`status`]). RPCs Hangar does not serve (inference,
//! model config and statistics, shared memory, trace and log settings) answer UNIMPLEMENTED
//! naming the HTTP route to use instead.

mod limits;
pub mod proto;
mod status;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::{Request, Response, Status, Streaming};

use crate::HangarService;
use crate::error::ApiError;
use crate::kserve::{self, LoadParameters, UnloadParameters};
use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::*;

/// Serves the gRPC service of `service` on `listener` until `shutdown` resolves, then
/// stops accepting (connections get GOAWAY), lets the calls in flight finish and returns —
/// without waiting for clients to close idle connections (a Triton client keeps its channel
/// open for as long as it lives).
///
/// The connections are bounded as [`crate::serve`]'s are, by the service's
/// [`ServerOptions::connections`](crate::ServerOptions::connections): the same cap with
/// shedding, a new connection that opens no stream (the HTTP/2 preface included) within
/// `header_read_timeout_s` is closed, as is an idle one after `idle_timeout_s`; request
/// bodies are due within `body_read_timeout_s`; `accept` errors pause. Each connection
/// carries at most 200 concurrent streams and is pinged every 30 s; one whose every answer
/// waits `http.stream_write_timeout_s` for a peer that takes no bytes is closed. A call's
/// key is checked before its message is read, and a message is decoded up to
/// `max_request_body_bytes` (see `limits`). No per-call timeout: a
/// repository load runs as long as the model's load takes.
///
/// # Errors
/// When the listener fails fatally.
pub async fn serve(
    listener: TcpListener,
    service: HangarService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let calls = Arc::new(Calls::default());
    let limits = service.state.options.connections;
    let stall = service.options().http.stream_write_timeout;
    let counters = service.state.metrics.listener("grpc");
    let grpc = limited(&service, Arc::clone(&calls));
    let incoming = crate::listen::Acceptor::new(listener, &limits, stall, counters, "grpc");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(crate::listen::H2_MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(crate::listen::H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(crate::listen::H2_KEEPALIVE_TIMEOUT))
        .serve_with_incoming_shutdown(grpc, incoming, wait(stopped.clone()));
    tokio::pin!(server, shutdown);
    tokio::select! {
        ended = &mut server => return ended,
        () = &mut shutdown => { let _ = stop.send(true); }
    }
    tokio::select! {
        ended = &mut server => ended,
        () = calls.idle() => Ok(()),
    }
}

/// Answers one gRPC call of `service` without a listener: the gate, the decode limit and
/// the handlers [`serve`] runs, with no connection's limits (there is none). For embedding
/// the service behind a server of one's own, and for the fuzz checks.
pub async fn call(
    service: &HangarService,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    use tonic::codegen::Service;
    match limited(service, Arc::new(Calls::default())).call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The generated server of `service`'s RPCs, decoding up to `max_request_body_bytes`,
/// behind the gate. One service, so no router: tonic's router would pin an older `matchit`
/// than ours.
fn limited(
    service: &HangarService,
    calls: Arc<Calls>,
) -> limits::Limited<GrpcInferenceServiceServer<Grpc>> {
    let max_message = service.options().max_request_body_bytes;
    let grpc = GrpcInferenceServiceServer::new(Grpc { http: service.clone(), calls })
        .max_decoding_message_size(max_message);
    limits::Limited::new(grpc, service.clone())
}

/// The calls in flight.
#[derive(Default)]
struct Calls {
    running: AtomicUsize,
    changed: Notify,
}

impl Calls {
    fn enter(self: &Arc<Self>) -> Call {
        self.running.fetch_add(1, Ordering::SeqCst);
        Call(Arc::clone(self))
    }

    /// Resolves once no call is in flight.
    async fn idle(&self) {
        loop {
            // Registered before the check, so a call ending in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            changed.await;
        }
    }
}

/// One call in flight, until dropped.
struct Call(Arc<Calls>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The gRPC face of a [`HangarService`].
struct Grpc {
    http: HangarService,
    calls: Arc<Calls>,
}

type Answer<T> = Result<Response<T>, Status>;

impl Grpc {
    /// Checks the caller's key against the auth class of the HTTP route `method path` that
    /// the RPC mirrors.
    fn authorize<T>(&self, request: &Request<T>, route: limits::Mirror) -> Result<Call, Status> {
        self.caller(request, route).map(|(call, _)| call)
    }

    /// Who is calling (as [`Self::authorize`] checks it): the keys' caller, or the keyless
    /// local agent on the repository calls.
    fn caller<T>(
        &self,
        request: &Request<T>,
        (method, path): limits::Mirror,
    ) -> Result<(Call, crate::auth::Caller), Status> {
        let call = self.calls.enter();
        let auth = crate::router::auth_of(&method, path);
        let headers = request.metadata().clone().into_headers();
        // The listener's connection tag (tonic puts it in the extensions) knows the peer.
        let tag = request.extensions().get::<crate::listen::ConnTag>();
        let peer = tag.map(|t| t.peer().ip());
        let options = self.http.options();
        let caller = crate::auth::Caller::of(options, auth, &method, path, peer, &headers)
            .map_err(status::status)?;
        Ok((call, caller))
    }

    fn manager(&self) -> &hangar_runtime::Manager {
        self.http.manager()
    }
}

fn fail(error: ApiError) -> Status {
    status::status(error)
}

/// UNIMPLEMENTED, saying what to use instead.
fn unserved<T>(rpc: &str, instead: &str) -> Answer<T> {
    Err(Status::unimplemented(format!("Hangar does not serve {rpc} over gRPC; {instead}")))
}

const INFER_INSTEAD: &str = "send inference over HTTP: POST /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/rerank (OpenAI-compatible)";
const SHM_INSTEAD: &str =
    "Hangar has no shared-memory tensor transport: requests carry their input in the HTTP body";

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(&self, request: Request<ServerLiveRequest>) -> Answer<ServerLiveResponse> {
        let _call = self.authorize(&request, limits::SERVER_LIVE)?;
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        request: Request<ServerReadyRequest>,
    ) -> Answer<ServerReadyResponse> {
        let _call = self.authorize(&request, limits::SERVER_READY)?;
        let ready = crate::health::not_ready_models(self.manager()).is_empty();
        Ok(Response::new(ServerReadyResponse { ready }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Answer<ModelReadyResponse> {
        let _call = self.authorize(&request, limits::MODEL_READY)?;
        let ModelReadyRequest { name, version } = request.into_inner();
        kserve::check_version(&name, &version).map_err(fail)?;
        let ready = kserve::readiness(self.manager(), &name, false).map_err(fail)?.is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        request: Request<ServerMetadataRequest>,
    ) -> Answer<ServerMetadataResponse> {
        let _call = self.authorize(&request, limits::SERVER_METADATA)?;
        let m = kserve::server_metadata_value();
        Ok(Response::new(ServerMetadataResponse {
            name: m.name,
            version: m.version,
            extensions: m.extensions,
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Answer<ModelMetadataResponse> {
        let _call = self.authorize(&request, limits::MODEL_METADATA)?;
        let ModelMetadataRequest { name, version } = request.into_inner();
        kserve::check_version(&name, &version).map_err(fail)?;
        let m = kserve::model_metadata(self.manager(), &name).map_err(fail)?;
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: Vec::new(),
            outputs: Vec::new(),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Answer<RepositoryIndexResponse> {
        let (_call, caller) = self.caller(&request, limits::REPOSITORY_INDEX)?;
        let request = request.into_inner();
        check_repository(&request.repository_name)?;
        let models = kserve::index_entries(self.manager(), request.ready, caller)
            .await
            .into_iter()
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: <&str>::from(e.state).to_owned(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Answer<RepositoryModelLoadResponse> {
        let (_call, caller) = self.caller(&request, limits::REPOSITORY_LOAD)?;
        let request = request.into_inner();
        check_repository(&request.repository_name)?;
        kserve::known(self.manager(), &request.model_name).await.map_err(fail)?;
        let parameters = LoadParameters::from_map(status::parameters(request.parameters));
        kserve::load_model(self.manager(), &request.model_name, parameters, caller)
            .await
            .map_err(fail)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Answer<RepositoryModelUnloadResponse> {
        let (_call, caller) = self.caller(&request, limits::REPOSITORY_UNLOAD)?;
        let request = request.into_inner();
        check_repository(&request.repository_name)?;
        let parameters =
            UnloadParameters::from_map(status::parameters(request.parameters)).map_err(fail)?;
        kserve::unload_model(self.manager(), &request.model_name, parameters, caller)
            .await
            .map_err(fail)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn model_infer(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("ModelInfer", INFER_INSTEAD)
    }

    type ModelStreamInferStream = tonic::codegen::BoxStream<Unserved>;

    async fn model_stream_infer(
        &self,
        _: Request<Streaming<Unserved>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        unserved("ModelStreamInfer", &format!("{INFER_INSTEAD}, with \"stream\": true"))
    }

    async fn model_config(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved(
            "ModelConfig",
            "GET /v1/admin/models/{name} has the model's definition and load_constraints",
        )
    }

    async fn model_statistics(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("ModelStatistics", "GET /metrics (Prometheus) has per-model request statistics")
    }

    async fn system_shared_memory_status(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("SystemSharedMemoryStatus", SHM_INSTEAD)
    }

    async fn system_shared_memory_register(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("SystemSharedMemoryRegister", SHM_INSTEAD)
    }

    async fn system_shared_memory_unregister(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("SystemSharedMemoryUnregister", SHM_INSTEAD)
    }

    async fn cuda_shared_memory_status(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("CudaSharedMemoryStatus", SHM_INSTEAD)
    }

    async fn cuda_shared_memory_register(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("CudaSharedMemoryRegister", SHM_INSTEAD)
    }

    async fn cuda_shared_memory_unregister(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("CudaSharedMemoryUnregister", SHM_INSTEAD)
    }

    async fn trace_setting(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved("TraceSetting", "tracing is set with RUST_LOG when hangard starts")
    }

    async fn log_settings(&self, _: Request<Unserved>) -> Answer<Unserved> {
        unserved(
            "LogSettings",
            "GET /v1/admin/models/{name}/logs has each engine's output; RUST_LOG sets Hangar's",
        )
    }
}

/// Hangar has one repository, its config: only the empty name selects it.
fn check_repository(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Ok(());
    }
    Err(Status::not_found(format!(
        "no repository '{name}': Hangar has one repository, its config; leave repository_name empty"
    )))
}
