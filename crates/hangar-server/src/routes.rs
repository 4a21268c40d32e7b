//! The route table: every route with its documentation, body, answers and error codes. The
//! router matches requests against it and the OpenAPI document is generated from it.

use http::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::error::ErrorCode::{self, Http as H, Runtime as R};
use crate::error::HttpCode::*;
use crate::error::RuntimeCode::*;
use crate::openai::{chat, completions, embeddings, models, rerank, responses};
use crate::router::Group::{Admin, Inference, MultiModel, Operations, Repository, WeightControl};
use crate::router::{Route, Success};
use crate::{admin, health, kserve, multi_model, node_metrics, openapi, sglang, ui};

/// Wraps an `async fn(Ctx) -> Result<Response, ApiError>` with the standard envelope.
macro_rules! api {
    ($f:path) => {
        |ctx| Box::pin(async move { $f(ctx).await.unwrap_or_else(ApiError::into_response) })
    };
}

/// Wraps an `async fn(Ctx) -> Result<Response, ApiError>` with the KServe v2 envelope.
macro_rules! v2 {
    ($f:path) => {
        |ctx| Box::pin(async move { $f(ctx).await.unwrap_or_else(ApiError::into_v2_response) })
    };
}

/// Wraps an `async fn(Ctx) -> Response` that encodes its own errors.
macro_rules! plain {
    ($f:path) => {
        |ctx| Box::pin($f(ctx))
    };
}

/// Errors of every route that admits an inference request.
pub(crate) const INFERENCE: &[ErrorCode] = &[
    R(InvalidRequest),
    R(UnknownModel),
    R(ModelTypeMismatch),
    R(ThinkingUnsupported),
    R(Unsupported),
    R(QueueFull),
    R(ModelNotLoaded),
    R(ModelLoading),
    R(ModelUnloading),
    R(ModelFailed),
    R(RuntimeError),
    R(BackendCrashed),
    R(UpstreamError),
    // A forwarding engine's answer over `limits.max_answer_bytes`.
    R(UpstreamAnswerTooLarge),
    R(BackendUnavailable),
    // An auto-load waits for the model's admin turn like any load.
    R(AdminBusy),
    // An operator paused the model with mode abort.
    R(GenerationAborted),
    // An auto-load that could only proceed by evicting pinned or leased models.
    R(SlotsPinned),
    // The model failed too often; `retry_after` says when a request may load it again.
    R(ModelQuarantined),
    // An auto-load that does not fit in the memory budget, or whose last load failed with
    // everything evicted and nothing freed since.
    R(InsufficientVram),
    R(InsufficientMemory),
    // A list longer than `limits` allow (messages, inputs, documents, tools, stop sequences).
    H(LimitExceeded),
    // The request ran past `limits.request_timeout_s`.
    R(DeadlineExceeded),
];

/// Errors of pause and continue.
const PAUSE: &[ErrorCode] = &[R(UnknownModel), R(StateConflict), R(AdminBusy)];

/// Errors of a sleep.
const SLEEP: &[ErrorCode] = &[
    R(UnknownModel),
    R(StateConflict),
    R(Unsupported),
    R(AdminBusy),
    R(RuntimeError),
    R(BackendCrashed),
];

/// Errors of a wake.
const WAKE: &[ErrorCode] = &[R(UnknownModel), R(AdminBusy), R(RuntimeError), R(BackendCrashed)];

/// Errors of a weight update.
const UPDATE: &[ErrorCode] = &[
    R(InvalidRequest),
    R(UnknownModel),
    R(StateConflict),
    R(InvalidLoadRequest),
    R(RequestsActive),
    R(LoadFailed),
    R(SlotsPinned),
    R(InsufficientVram),
    R(InsufficientMemory),
    R(AdminBusy),
];

/// Errors of the weights checker.
const CHECKER: &[ErrorCode] =
    &[R(UnknownModel), R(WeightsUnreadable), R(NotImplemented), R(AdminBusy)];

/// SGLang's root paths add `invalid_request` (no `model` named, several loaded). Its weight
/// update shares [`UPDATE`], which has it already (a body naming another model).
const SGLANG_PAUSE: &[ErrorCode] =
    &[R(InvalidRequest), R(UnknownModel), R(StateConflict), R(AdminBusy)];
const SGLANG_CHECKER: &[ErrorCode] =
    &[R(InvalidRequest), R(UnknownModel), R(WeightsUnreadable), R(NotImplemented), R(AdminBusy)];
const SGLANG_CHECKER_GET: &[ErrorCode] = &[
    R(InvalidRequest),
    R(UnknownModel),
    R(WeightsUnreadable),
    H(MethodNotAllowed),
    R(WouldPause),
    R(AdminBusy),
];

const LOAD: &[ErrorCode] = &[
    R(UnknownModel),
    R(InvalidLoadRequest),
    R(LoadFailed),
    R(SlotsPinned),
    R(InsufficientVram),
    R(InsufficientMemory),
    R(StateConflict),
    R(AdminBusy),
];

/// Every route of the service.
pub(crate) fn all() -> Vec<Route> {
    let (get, post) = (Method::GET, Method::POST);
    vec![
        // Admin: runtime-admin-api.md
        Route::new(get.clone(), "/v1/admin/models", Admin, api!(admin::list))
            .admin()
            .doc(
                "List models with their live state",
                "Every model of the merged config with its live runtime state, replica and in-flight counts, VRAM estimate, load constraints and recommendations, active load override, capabilities and configured definition; `?state=` and `?type=` filter. The main UI source of truth.",
            )
            .query::<admin::ModelsQuery>()
            .ok::<admin::ModelsResponse>()
            .errors(&[R(InvalidRequest)]),
        Route::new(get.clone(), "/v1/admin/models/{name}", Admin, api!(admin::show))
            .admin()
            .doc(
                "One model with its live state",
                "The same row as in the list, for one model. 404 unknown_model for a name not in config.",
            )
            .ok::<admin::ModelRow>()
            .errors(&[R(UnknownModel)]),
        Route::new(post.clone(), "/v1/admin/models/{name}/load", Admin, api!(admin::load))
            .admin()
            .doc(
                "Load a configured model",
                "Loads a model of the merged config and answers when it is loaded or failed. Optional body: `replicas` and backend-specific runtime-only overrides (see the model's load_constraints). 200 when already loaded or loading (without options); 400 invalid_load_request for values wrong for the backend or options sent to a loaded model; 422 for bodies that fail the schema; 409 state_conflict while the model is unloading; 400 load_failed when the load ran and failed (the model is then `failed`, `error.model.last_error` says why). An explicit load lifts a quarantine (see the row's `quarantine`). With a `vram_budget`, a GPU model that does not fit evicts least recently used idle models for memory (journal reason `vram_budget`); when even that cannot make room: 507 insufficient_vram with `error.vram_shortfall` (needed, free and missing MiB, and the models holding memory), nothing evicted.",
            )
            .body::<admin::LoadBody>(true)
            .ok::<admin::ModelRow>()
            .errors(LOAD),
        Route::new(post.clone(), "/v1/admin/models/{name}/unload", Admin, api!(admin::unload))
            .admin()
            .doc(
                "Gracefully unload a model",
                "Stops admissions, cancels queued requests with model_unloading, lets running requests finish, releases the runtimes, then answers. 200 when already unloaded or unloading; 409 state_conflict while loading.",
            )
            .ok::<admin::ModelRow>()
            .errors(&[R(UnknownModel), R(StateConflict), R(AdminBusy)]),
        Route::new(get.clone(), "/v1/admin/models/{name}/logs", Admin, api!(admin::logs))
            .admin()
            .doc(
                "A model's engine output",
                "The last `tail` lines (default 100; 2,000 are kept across loads) of the model's engine processes: stdout and stderr line by line with timestamp and replica, plus Hangar's own lines (the command line it started, exit statuses). With `follow=true`, server-sent events: those lines, then every new one as it is written, until the server shuts down (a last `{\"type\": \"shutdown\"}` event). Engines in Hangar's process have an empty log.",
            )
            .query::<admin::LogsQuery>()
            .ok_or_events::<admin::LogsResponse, admin::LogLineOut>()
            .errors(&[R(UnknownModel), R(InvalidRequest)]),
        Route::new(get.clone(), "/v1/admin/events", Admin, api!(admin::events))
            .admin()
            .doc(
                "Live changes of every model",
                "Server-sent events, one per change, from now on: state transitions (with their cause and, for failures and crashes, the error), load progress in 5 % steps, evictions with their reason and the model that needed the room. Each event's `id` is `<epoch>-<n>`; a client that reconnects with `Last-Event-ID` (the header browsers send, or the `last_event_id` query parameter) first gets every event it missed from the last 1,024 kept. When some are gone (too far behind, or the server restarted) a `{\"type\": \"resync\"}` event without an id comes first: re-read `GET /v1/admin/models`. A comment line every 15 s keeps idle connections open through proxies. When the server shuts down, a last `{\"type\": \"shutdown\"}` event without an id ends the stream.",
            )
            .query::<admin::EventsQuery>()
            .events::<admin::EventOut>()
            .errors(&[R(InvalidRequest)]),
        Route::new(post.clone(), "/v1/admin/models/{name}/pause", Admin, api!(admin::pause))
            .admin()
            .doc(
                "Pause a model's generation",
                "Stops the model from running requests without unloading it. New requests wait in its queue (bounded as always) until continue. `mode`: `abort` (default) ends queued and running requests with 503 generation_aborted; `retract` stops running generations, puts them back at the head of the queue and resumes them after continue from the text already sent, so their clients see one uninterrupted answer (requests the engine cannot resume — structured output, tools, forwarding engines, embeddings — finish in place); `in_place` lets running requests finish and queued ones wait. Pausing a paused model applies the new mode. The row's `pause` says the mode, who paused and since when.",
            )
            .body::<admin::PauseBody>(true)
            .ok::<admin::ModelRow>()
            .errors(PAUSE),
        Route::new(post.clone(), "/v1/admin/models/{name}/continue", Admin, api!(admin::resume))
            .admin()
            .doc(
                "Continue a paused model",
                "Grants slots again, retracted generations first. A model that is not paused is answered as it is.",
            )
            .ok::<admin::ModelRow>()
            .errors(&[R(UnknownModel), R(AdminBusy)]),
        Route::new(post.clone(), "/v1/admin/models/{name}/sleep", Admin, api!(admin::sleep))
            .admin()
            .doc(
                "Put a model to sleep",
                "Keeps the model loaded (its slot, its readiness) and gives back what other models need: its gate closes (new requests wait in its queue), running requests finish, each replica answers a short deterministic check (the reference for its wake), then sleeps at the lightest level its engine can (`context`: the KV cache and compute buffers go, the weights stay where they were loaded — llama.cpp in process; `weights_to_host` and `weights_discarded`: vLLM's levels 1 and 2). A request for a sleeping model waits in its queue while the model wakes. The row's `residency` says where it resides. A sleeping model is answered as it is; an engine that cannot sleep is 400 unsupported (unload it instead); an engine that refuses leaves the model serving, with its error.",
            )
            .ok::<admin::ModelRow>()
            .errors(SLEEP),
        Route::new(post.clone(), "/v1/admin/models/{name}/wake", Admin, api!(admin::wake))
            .admin()
            .doc(
                "Wake a sleeping model",
                "Each replica takes back what it gave and answers the check it answered before sleeping; when every answer agrees, the model serves again (unless an operator's pause holds it). A replica that cannot wake or answers otherwise fails the model (`failed`, its `last_error` saying why; the answer is 500 runtime_error): a woken engine can say it is healthy and still answer wrong. A model that is awake, or not loaded, is answered as it is.",
            )
            .ok::<admin::ModelRow>()
            .errors(WAKE),
        Route::new(
            post.clone(),
            "/v1/admin/models/{name}/update-weights-from-disk",
            Admin,
            api!(admin::update_weights),
        )
        .admin()
        .doc(
            "Replace a loaded model's weights",
            "Pauses the model, loads the weights at `model_path` (default: the configured one) next to the running ones, swaps them in behind the same queue, releases the old ones, sets `weight_version` when given, and continues unless `keep_pause`. 409 requests_active while requests run, unless `abort_all_requests` (they end with generation_aborted) or the model is paused with `retract`. When the new weights fail to load, the old ones keep serving, the pause is undone, and the answer is 400 load_failed. Loading both costs the model's memory twice for the length of the load, so the new weights are admitted like a load: under a `vram_budget`, least recently used idle models are evicted to make room, or the answer is 507 insufficient_vram with `error.vram_shortfall` (nothing evicted, the old weights serving, the pause undone). The model is held (never evicted) for the whole update; if it stops serving meanwhile (a crash), the new weights are released and the answer is 409 state_conflict. `load_format` and `flush_cache` are accepted for SGLang compatibility.",
        )
        .body::<admin::UpdateWeightsBody>(true)
        .ok::<admin::ModelRow>()
        .errors(UPDATE),
        Route::new(
            post.clone(),
            "/v1/admin/models/{name}/weights-checker",
            Admin,
            api!(admin::weights_checker),
        )
        .admin()
        .doc(
            "Checksum the weights a model runs on",
            "Reads the model's weight files (GGUF, or safetensors files and directories) and digests every tensor: SHA-256 of its name, dtype, shape and raw bytes, and a model checksum over the sorted tensor digests. While a loaded model's files are read it admits nothing (requests wait; running ones go on). `action`: `checksum`; `snapshot` also remembers the digests; `compare` reports the tensors that changed, went missing or appeared since the snapshot; `reset_tensors` is refused with 501 (Hangar never changes weights in place).",
        )
        .body::<admin::WeightsCheckerBody>(false)
        .ok::<admin::WeightsCheckerResponse>()
        .errors(CHECKER),
        Route::new(post.clone(), "/v1/admin/models/{name}/leases", Admin, api!(admin::acquire_lease))
            .admin()
            .doc(
                "Hold a model loaded for a job",
                "Takes a lease (`owner`, `ttl_seconds` up to a week), loading the model first if needed (the load's errors come back, and no lease is kept). A model with a live lease is never evicted nor unloaded for idleness; a load that could only proceed by evicting it fails with 409 slots_pinned. Renew before `expires_unix_ms`; expired leases are dropped. An explicit unload still unloads the model and revokes its leases. Leases are listed in the row. A quarantined model is not loaded for a lease: 503 model_quarantined with `retry_after`; nor one whose last load failed with every model that may be evicted on its devices evicted and nothing freed since: 507 insufficient_vram (insufficient_memory off the GPU). A model holds at most `limits.max_leases_per_model` live leases: one more is 429 too_many_leases (retry once one is released or expires); `owner` is at most 256 bytes.",
            )
            .body::<admin::LeaseBody>(false)
            .ok::<admin::LeaseResponse>()
            .errors(&[
                R(UnknownModel),
                R(InvalidLoadRequest),
                R(LoadFailed),
                R(SlotsPinned),
                R(InsufficientVram),
                R(InsufficientMemory),
                R(StateConflict),
                R(AdminBusy),
                R(ModelQuarantined),
                R(TooManyLeases),
            ]),
        Route::new(post.clone(), "/v1/admin/models/{name}/leases/{id}", Admin, api!(admin::renew_lease))
            .admin()
            .doc(
                "Renew a lease",
                "Starts the lease again for `ttl_seconds` (its own length when absent). 404 lease_not_found once it was released or expired.",
            )
            .body::<admin::RenewBody>(true)
            .ok::<crate::wire::Lease>()
            .errors(&[R(UnknownModel), R(LeaseNotFound), R(InvalidLoadRequest)]),
        Route::new(Method::DELETE, "/v1/admin/models/{name}/leases/{id}", Admin, api!(admin::release_lease))
            .admin()
            .doc(
                "Release a lease",
                "Ends the lease; the model stays loaded, evictable and idle-unloadable again unless another lease or `pinned` holds it.",
            )
            .ok::<crate::wire::Lease>()
            .errors(&[R(UnknownModel), R(LeaseNotFound)]),
        // Weight control at SGLang's paths: admin-control.md
        Route::new(get.clone(), "/model_info", WeightControl, plain!(sglang::model_info_get))
            .admin()
            .doc(
                "Model info (SGLang)",
                "The model's weights path, tokenizer path, whether it generates text, `weight_version` (`default` before any update), state and pause. `?model=` is needed only when more than one model is loaded.",
            )
            .query::<sglang::ModelQuery>()
            .ok::<sglang::ModelInfo>()
            .errors(&[R(InvalidRequest), R(UnknownModel)]),
        Route::new(post.clone(), "/model_info", WeightControl, plain!(sglang::model_info_post))
            .admin()
            .doc("Model info (SGLang)", "As GET, the model named in the body.")
            .body::<sglang::ModelBody>(true)
            .ok::<sglang::ModelInfo>()
            .errors(&[R(InvalidRequest), R(UnknownModel)]),
        Route::new(post.clone(), "/pause_generation", WeightControl, plain!(sglang::pause_generation))
            .admin()
            .doc(
                "Pause generation (SGLang)",
                "`POST /v1/admin/models/{name}/pause` for the model named by `model`, or the one loaded.",
            )
            .body::<sglang::PauseGenerationBody>(true)
            .ok::<sglang::ControlResult>()
            .errors(SGLANG_PAUSE),
        Route::new(
            post.clone(),
            "/continue_generation",
            WeightControl,
            plain!(sglang::continue_generation),
        )
        .admin()
        .doc("Continue generation (SGLang)", "`POST /v1/admin/models/{name}/continue` for the model named by `model`, or the one loaded.")
        .body::<sglang::ModelBody>(true)
        .ok::<sglang::ControlResult>()
        .errors(&[R(InvalidRequest), R(UnknownModel), R(AdminBusy)]),
        Route::new(
            post.clone(),
            "/update_weights_from_disk",
            WeightControl,
            plain!(sglang::update_weights_from_disk),
        )
        .admin()
        .doc(
            "Update weights from disk (SGLang)",
            "`POST /v1/admin/models/{name}/update-weights-from-disk` for the model named by `model`, or the one loaded; answers `success`, `message` and the `weight_version` in effect.",
        )
        .body::<admin::UpdateWeightsBody>(false)
        .ok::<sglang::ControlResult>()
        .errors(UPDATE),
        Route::new(post.clone(), "/weights_checker", WeightControl, plain!(sglang::weights_checker_post))
            .admin()
            .doc(
                "Weights checker (SGLang)",
                "`POST /v1/admin/models/{name}/weights-checker` for the model named by `model`, or the one loaded.",
            )
            .body::<sglang::WeightsCheckerBody>(false)
            .ok::<sglang::CheckerResult>()
            .errors(SGLANG_CHECKER),
        Route::new(get.clone(), "/weights_checker", WeightControl, plain!(sglang::weights_checker_get))
            .admin()
            .doc(
                "Weights checker, read-only (SGLang)",
                "As POST, with `?action=` (default `checksum`) and `?model=`, for the read-only actions only: a GET can be sent by any web page, so it changes nothing. `snapshot` and `reset_tensors` answer 405 `method_not_allowed`; a `checksum` or `compare` of a loaded model that is not paused (it would pause it while the files are read) answers 405 `would_pause`. Use POST for those.",
            )
            .query::<sglang::WeightsCheckerQuery>()
            .ok::<sglang::CheckerResult>()
            .errors(SGLANG_CHECKER_GET),
        Route::new(post.clone(), "/update_weights_from_tensor", WeightControl, plain!(sglang::no_tensor_plane))
            .admin()
            .doc("Update weights from tensors (SGLang): 501", "Not served: Hangar has no tensor data plane. Write the weights to disk and call /update_weights_from_disk.")
            .errors(&[R(NotImplemented)]),
        Route::new(post.clone(), "/init_weights_update_group", WeightControl, plain!(sglang::no_tensor_plane))
            .admin()
            .doc("Init a weights update group (SGLang): 501", "Not served: Hangar has no distributed weight-update group.")
            .errors(&[R(NotImplemented)]),
        Route::new(post.clone(), "/destroy_weights_update_group", WeightControl, plain!(sglang::no_tensor_plane))
            .admin()
            .doc("Destroy a weights update group (SGLang): 501", "Not served: Hangar has no distributed weight-update group.")
            .errors(&[R(NotImplemented)]),
        Route::new(post.clone(), "/update_weights_from_distributed", WeightControl, plain!(sglang::no_tensor_plane))
            .admin()
            .doc("Update weights from a distributed group (SGLang): 501", "Not served: Hangar has no tensor data plane.")
            .errors(&[R(NotImplemented)]),
        Route::new(get.clone(), "/v1/admin/gpu-memory", Admin, api!(admin::gpu_memory))
            .admin()
            .doc(
                "GPU memory and per-model VRAM estimates",
                "GPU memory per device (empty with an error string when no telemetry is available; `budget_mib` when a `vram_budget` is set) and every model's VRAM estimate, with `vram_detail` for GPU models: the figure admission uses and how it was obtained (`process_tree`: NVML's memory of the engine child and its descendants; `observed_load_delta`; `gguf_estimate`: the GGUF files plus the KV cache for the context and cache types; `model_artifact_size`).",
            )
            .ok::<admin::GpuMemoryResponse>(),
        Route::new(post.clone(), "/v1/admin/config/reload", Admin, api!(admin::reload))
            .admin()
            .doc(
                "Re-read the config and apply its models",
                "Re-reads `settings.json` + `local.json` (as `SIGHUP` does) and applies the models without a restart: new models appear (unloaded); removed ones answer to no name at once and are unloaded gracefully, running requests finishing; a changed definition applies at once to a model with nothing running, else at its next load after an unload (`pending`, and the row's `pending_definition`). Aliases apply at once. Other settings that changed are listed in `restart_required` and apply at the next start. An invalid config changes nothing: 400 invalid_config with every problem in `error.problems`. Each change is an event (`definition`).",
            )
            .ok::<admin::ReloadResponse>()
            .errors(&[H(InvalidConfig), H(ReloadUnavailable)]),
        // Inference: OpenAI-compatible
        Route::new(post.clone(), "/v1/chat/completions", Inference, api!(chat::handle))
            .doc(
                "Chat completion",
                "OpenAI-compatible chat completion; `stream: true` answers with server-sent events in OpenAI's chunk format ending with `[DONE]`. The request is checked against the model's type and capabilities first (400, nothing is loaded), then admitted only while the model is loaded (or auto-loaded), else 503 with the state's code.",
            )
            .body::<chat::ChatCompletionRequest>(false)
            .example(|m| {
                let messages = json!([{ "role": "user", "content": "Say hello." }]);
                Some(json!({ "model": m.llm.as_ref()?, "messages": messages, "max_tokens": 8 }))
            })
            .ok_or_events::<chat::ChatCompletion, chat::ChatCompletionChunk>()
            .errors(INFERENCE),
        Route::new(post.clone(), "/v1/completions", Inference, api!(completions::handle))
            .doc(
                "Text completion",
                "OpenAI-compatible completion of a raw prompt; streams `text_completion` chunks with `stream: true`.",
            )
            .body::<completions::CompletionRequest>(false)
            .example(|m| {
                Some(json!({ "model": m.llm.as_ref()?, "prompt": "Once upon", "max_tokens": 8 }))
            })
            .ok_or_events::<completions::Completion, completions::Completion>()
            .errors(INFERENCE),
        Route::new(post.clone(), "/v1/responses", Inference, api!(responses::handle))
            .doc(
                "Response (OpenAI Responses API)",
                "Generates a response from `input` (a string or items). `thinking` (default/enabled/disabled) must be one of the model's capabilities.thinking_modes, else 400 thinking_unsupported. TranslateGemma models take `source_lang_code` / `target_lang_code`. Streams Responses API events with `stream: true`.",
            )
            .body::<responses::ResponsesRequest>(false)
            .example(|m| {
                Some(json!({ "model": m.llm.as_ref()?, "input": "Say hello.", "max_output_tokens": 8 }))
            })
            .ok_or_events::<responses::ResponseObject, crate::openai::ResponseEvent>()
            .errors(INFERENCE),
        Route::new(post.clone(), "/v1/embeddings", Inference, api!(embeddings::handle))
            .doc(
                "Embeddings",
                "OpenAI-compatible embeddings for a string or a list of strings, for models of type embedding (400 model_type_mismatch for others).",
            )
            .body::<embeddings::EmbeddingsRequest>(false)
            .example(|m| Some(json!({ "model": m.embedding.as_ref()?, "input": ["a hangar", "a plane"] })))
            .ok::<embeddings::EmbeddingList>()
            .errors(INFERENCE),
        Route::new(post.clone(), "/v1/rerank", Inference, api!(rerank::handle))
            .doc(
                "Rerank documents",
                "Scores `documents` against `query` with a reranking model; results sorted by relevance with their original index.",
            )
            .body::<rerank::RerankBody>(false)
            .example(|m| {
                let documents = json!(["planes park in a hangar", "bread is baked"]);
                Some(json!({ "model": m.reranking.as_ref()?, "query": "where do planes park?", "documents": documents }))
            })
            .ok::<rerank::RerankResponse>()
            .errors(INFERENCE),
        Route::new(get.clone(), "/v1/models", Inference, api!(models::list))
            .doc(
                "List models (OpenAI format)",
                "Every configured model in OpenAI's list format, with its runtime state.",
            )
            .ok::<models::ModelList>(),
        Route::new(get.clone(), "/v1/models/{name}", Inference, api!(models::get))
            .doc("One model (OpenAI format)", "One configured model in OpenAI's model format.")
            .ok::<models::ModelObject>()
            .errors(&[R(UnknownModel)]),
        // Multi-model: multi-model.md
        Route::new(get.clone(), "/api/v1/health", MultiModel, api!(multi_model::health))
            .doc(
                "Health with every loaded model",
                "Server health; `model_loaded` / `checkpoint_loaded` refer to the most recently loaded model; `all_models_loaded` lists every loaded model with its checkpoint, last use, type, device and backend URL. Open; while keys are configured, checkpoints and backend URLs are `null` for callers without an inference or admin key.",
            )
            .ok::<multi_model::HealthResponse>(),
        Route::new(get.clone(), "/api/v1/stats", MultiModel, api!(multi_model::stats))
            .inference()
            .doc("Stats of the most recent request", "Statistics of the most recent inference request.")
            .ok::<multi_model::StatsResponse>(),
        Route::new(post.clone(), "/api/v1/load", MultiModel, api!(multi_model::load))
            .admin()
            .doc(
                "Load a model (Lemonade-style)",
                "Loads `model_name`, evicting the least recently used model of its type when its slots are full; the same options as the running load are a no-op. `ctx_size` maps to the backend's context field; `llamacpp_args` and `llamacpp_backend` apply to llama_server models only.",
            )
            .body::<multi_model::LoadBody>(false)
            .ok::<admin::ModelRow>()
            .errors(LOAD),
        Route::new(post.clone(), "/api/v1/unload", MultiModel, api!(multi_model::unload))
            .admin()
            .doc(
                "Unload one model, or all",
                "Unloads `model_name` (404 nothing_to_unload if it is not loaded), or every loaded model when no name is given.",
            )
            .body::<multi_model::UnloadBody>(true)
            .ok::<multi_model::UnloadResponse>()
            .errors(&[R(UnknownModel), H(NothingToUnload), R(StateConflict), R(AdminBusy)]),
        // Model repository: KServe v2 / Triton
        Route::new(get.clone(), "/v2", Repository, v2!(kserve::server_metadata))
            .doc(
                "Server metadata (KServe v2)",
                "Server name, version and extensions, as KServe v2 clients expect.",
            )
            .ok::<kserve::ServerMetadata>(),
        Route::new(get.clone(), "/v2/health/live", Repository, v2!(kserve::live))
            .doc("Liveness (KServe v2)", "200 with an empty body while the process is up."),
        Route::new(get.clone(), "/v2/health/ready", Repository, v2!(kserve::ready))
            .doc("Readiness (KServe v2)", "200 when every enabled model is loaded, else 503.")
            .errors(&[R(ModelNotLoaded)]),
        Route::new(get.clone(), "/v2/models/{name}", Repository, v2!(kserve::model_metadata_route))
            .doc(
                "Model metadata (KServe v2)",
                "The model's name, its one version (`1`) and its engine as `platform`. `inputs` and `outputs` are empty: Hangar's models take OpenAI-compatible JSON, not tensors. 404 for a model not in config.",
            )
            .ok::<kserve::ModelMetadata>()
            .errors(&[R(UnknownModel)]),
        Route::new(get.clone(), "/v2/models/{name}/ready", Repository, v2!(kserve::model_ready))
            .doc(
                "Model readiness (KServe v2)",
                "200 when the model is loaded, else 400 (configured, not ready) or 404 as Triton answers.",
            )
            .errors(&[R(UnknownModel), H(ModelNotReady)]),
        Route::new(post.clone(), "/v2/repository/index", Repository, v2!(kserve::index))
            .admin()
            .doc(
                "Repository index",
                "Every model with its state (READY, LOADING, UNLOADING, UNAVAILABLE with a reason). `ready: true` lists only ready models.",
            )
            .body::<kserve::IndexBody>(true)
            .ok::<Vec<kserve::IndexEntry>>(),
        Route::new(post.clone(), "/v2/repository/models/{name}/load", Repository, v2!(kserve::load))
            .admin()
            .doc(
                "Load or reload a model",
                "Loads the model. Already loaded without parameters: no-op. With `parameters.config` (a JSON object or a JSON string): an atomic reload with that config as the override patch — the patch is checked first, the old runtime serves until the new one is loaded and keeps serving when the reload fails. The new runtime is admitted next to the old one (under a `vram_budget`, idle models are evicted for it, or the answer is 507 insufficient_vram); a pause set on the model stays. `file:` parameters are refused. A failed load answers 400. Called keyless as the trusted local agent (`http.trust_local_repository_agent`): only a model of the repository folder, not pinned, without `parameters.config` (else 403).",
            )
            .body::<kserve::LoadBody>(true)
            .ok::<kserve::Empty>()
            .errors(&[
                R(UnknownModel),
                R(InvalidRequest),
                R(InvalidLoadRequest),
                R(LoadFailed),
                R(SlotsPinned),
                R(InsufficientVram),
                R(InsufficientMemory),
                R(StateConflict),
                R(AdminBusy),
            ]),
        Route::new(
            post.clone(),
            "/v2/repository/models/{name}/unload",
            Repository,
            v2!(kserve::unload),
        )
        .admin()
        .doc(
            "Unload a model",
            "Gracefully unloads the model; `parameters.unload_dependents` is accepted (models have no dependents). Called keyless as the trusted local agent: only a model of the repository folder (else 403), never a pinned one (403) or a leased one (409 state_conflict; its leases stay).",
        )
        .body::<kserve::UnloadBody>(true)
        .ok::<kserve::Empty>()
        .errors(&[R(UnknownModel), R(InvalidRequest), R(StateConflict), R(AdminBusy)]),
        // Operations
        Route::new(get.clone(), "/metrics", Operations, api!(health::metrics))
            .metrics()
            .doc(
                "Prometheus metrics",
                "Per-model state, in-flight and queue gauges, request counts and latency histograms by model and outcome, load / unload / eviction / crash counters. OpenMetrics text when the `Accept` header asks for it, else the Prometheus text format.",
            )
            .success(Success::Metrics),
        Route::new(get.clone(), "/metrics/node", Operations, api!(node_metrics::node))
            .metrics()
            .doc(
                "Node gauges for routers (llm-d / Gateway API Inference Extension)",
                "The machine-level gauges an inference router's endpoint picker reads from a vLLM pod, one series per name: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (the share of the loaded models' request slots in use, 0 to 1) and `vllm:lora_requests_info` (`running_lora_adapters`: the names the loaded models answer to; `waiting_lora_adapters`: the models loading; `max_lora`: the llm slots; the value is the reading's time), so the picker routes each model to a node that serves it. Prometheus text; see docs/cluster.md.",
            )
            .success(Success::Metrics),
        Route::new(get.clone(), "/openapi.json", Operations, api!(openapi::document))
            .doc(
                "This document",
                "The OpenAPI 3.1 document of the service, generated from the same types the handlers use.",
            )
            .ok::<Map<String, Value>>(),
        Route::new(get.clone(), "/ui", Operations, api!(ui::index))
            .doc(
                "The web workbench",
                "A single page over the public APIs: every model live (from `/v1/admin/events`, polling while the stream is down) with filters, a load dialog built from each model's `load_constraints` and `load_recommendations`, load / unload / pause / continue / lease / checksum, logs, GPU memory and a chat or embedding playground. It asks for the admin key when the server wants one and keeps it for the browser tab.",
            )
            .success(Success::Html),
        Route::new(get.clone(), "/ui/{name}", Operations, api!(ui::file))
            .doc("The workbench's assets", "`app.js` (an ES module), `app.css` and `favicon.svg`.")
            .success(Success::Text)
            .errors(&[H(NotFound)]),
        Route::new(get.clone(), "/healthz", Operations, api!(health::healthz))
            .doc("Liveness", "200 while the process is up.")
            .ok::<health::Healthz>(),
        Route::new(get.clone(), "/health", Operations, api!(health::healthz))
            .doc("Liveness, by the name routers probe", "`/healthz` under the path vLLM, SGLang and `llama-server` serve it, which routers such as `vllm-router` probe on every worker.")
            .ok::<health::Healthz>(),
        Route::new(get, "/readyz", Operations, api!(health::readyz))
            .doc(
                "Readiness",
                "200 when every model with `enabled: true` is loaded, else 503 listing the ones that are not.",
            )
            .ok::<health::Readyz>()
            .also::<health::Readyz>(StatusCode::SERVICE_UNAVAILABLE),
    ]
    .into_iter()
    .chain(crate::anthropic::routes())
    .collect()
}
