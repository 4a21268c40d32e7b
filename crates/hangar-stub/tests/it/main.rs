//! The stub backend, on paused virtual time: determinism, latency, stop rules, cancellation,
//! injected failures and crashes, and the live-runtime count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangar_backend::{
    Backend, ChatMessage, EmbedRequest, FinishReason, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, LoadRequest, ProgressSink, Prompt, RerankRequest, Role, Runtime,
    RuntimeError, SamplingParams, ThinkingMode,
};
use hangar_config::validate_load_override;
use hangar_config::{BackendKind, ModelConfig, ModelName};
use hangar_stub::StubBackend;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

fn model(config: Value) -> Arc<ModelConfig> {
    Arc::new(ModelConfig::parse(&ModelName::new("stubby").unwrap(), &config).unwrap())
}

fn stub_model(stub: Value) -> Arc<ModelConfig> {
    model(json!({ "backend": "stub", "stub": stub }))
}

fn request(model: &Arc<ModelConfig>) -> LoadRequest {
    LoadRequest::new(Arc::clone(model), 0, 1)
}

async fn load(backend: &StubBackend, stub: Value) -> Arc<dyn Runtime> {
    backend.load(request(&stub_model(stub))).await.unwrap()
}

fn text(prompt: &str, max_tokens: Option<u32>, stop: &[&str]) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text(prompt.to_owned()),
        params: SamplingParams {
            max_tokens,
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
            ..SamplingParams::default()
        },
        thinking: ThinkingMode::Default,
        translation: None,
        tools: None,
        format: None,
        resume: None,
    }
}

/// Runs a generation to the end and returns the pieces it emitted and its result.
async fn generate(
    runtime: &Arc<dyn Runtime>,
    request: GenerateRequest,
) -> (Vec<String>, Result<GenerateSummary, RuntimeError>) {
    let (tx, mut rx) = mpsc::channel(256);
    let result = runtime.generate(request, tx).await;
    let mut pieces = Vec::new();
    while let Some(GenerateEvent::Text(piece)) = rx.recv().await {
        pieces.push(piece);
    }
    (pieces, result)
}

#[tokio::test(start_paused = true)]
async fn equal_prompts_get_equal_replies() {
    let backend = StubBackend::new();
    let a = load(&backend, json!({})).await;
    let b = load(&backend, json!({})).await;
    let (first, r1) = generate(&a, text("tell me about hangars", None, &[])).await;
    let (second, r2) = generate(&b, text("tell me about hangars", None, &[])).await;
    assert!(!first.is_empty());
    assert_eq!(first, second);
    assert_eq!(r1, r2);
    let (other, _) = generate(&a, text("something else entirely", None, &[])).await;
    assert_ne!(first, other);
    // One word per token, words after the first prefixed with a space.
    assert!(!first[0].starts_with(' '));
    assert!(first[1..].iter().all(|p| p.starts_with(' ') && p.split_whitespace().count() == 1));
}

#[tokio::test(start_paused = true)]
async fn a_fixed_reply_shorter_than_max_tokens_stops() {
    let runtime = load(&StubBackend::new(), json!({ "reply": "one two three" })).await;
    let (pieces, summary) = generate(&runtime, text("four words of prompt", None, &[])).await;
    assert_eq!(pieces.concat(), "one two three");
    let summary = summary.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Stop);
    assert_eq!((summary.prompt_tokens, summary.completion_tokens), (4, 3));
}

#[tokio::test(start_paused = true)]
async fn generation_stops_at_max_tokens_with_length() {
    let long = (0..40).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let runtime = load(&StubBackend::new(), json!({ "reply": long })).await;
    let (pieces, summary) = generate(&runtime, text("hi", Some(5), &[])).await;
    assert_eq!(pieces.concat(), "w0 w1 w2 w3 w4");
    let summary = summary.unwrap();
    assert_eq!((summary.finish_reason, summary.completion_tokens), (FinishReason::Length, 5));
    // The default is 16 tokens.
    let (pieces, summary) = generate(&runtime, text("hi", None, &[])).await;
    assert_eq!(pieces.len(), 16);
    assert_eq!(summary.unwrap().finish_reason, FinishReason::Length);
}

#[tokio::test(start_paused = true)]
async fn a_stop_sequence_ends_generation_before_the_word_that_contains_it() {
    let runtime = load(&StubBackend::new(), json!({ "reply": "alpha beta gamma delta" })).await;
    let (pieces, summary) = generate(&runtime, text("hi", None, &["", "gamma"])).await;
    assert_eq!(pieces.concat(), "alpha beta");
    let summary = summary.unwrap();
    assert_eq!((summary.finish_reason, summary.completion_tokens), (FinishReason::Stop, 2));
    // A stop sequence spanning two words stops before the second.
    let (pieces, _) = generate(&runtime, text("hi", None, &["beta gam"])).await;
    assert_eq!(pieces.concat(), "alpha beta");
    let (pieces, _) = generate(&runtime, text("hi", None, &["alp"])).await;
    assert!(pieces.is_empty());
}

#[tokio::test(start_paused = true)]
async fn token_latency_passes_in_virtual_time() {
    let runtime = load(&StubBackend::new(), json!({ "token_latency_ms": 100 })).await;
    let start = Instant::now();
    let (pieces, summary) = generate(&runtime, text("hi", Some(5), &[])).await;
    assert_eq!(pieces.len(), 5);
    assert_eq!(summary.unwrap().completion_tokens, 5);
    assert_eq!(start.elapsed(), Duration::from_millis(500));

    let instant = load(&StubBackend::new(), json!({})).await;
    let start = Instant::now();
    generate(&instant, text("hi", Some(5), &[])).await.1.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_receiver_cancels_generation() {
    let runtime = load(&StubBackend::new(), json!({ "token_latency_ms": 100 })).await;
    let (tx, rx) = mpsc::channel(8);
    drop(rx);
    let result = runtime.generate(text("hi", Some(10), &[]), tx).await;
    assert_eq!(result, Err(RuntimeError::Cancelled));

    let (tx, mut rx) = mpsc::channel(1);
    let start = Instant::now();
    let task = {
        let runtime = Arc::clone(&runtime);
        tokio::spawn(async move { runtime.generate(text("hi", Some(10), &[]), tx).await })
    };
    assert!(rx.recv().await.is_some());
    assert!(rx.recv().await.is_some());
    drop(rx);
    assert_eq!(task.await.unwrap(), Err(RuntimeError::Cancelled));
    // It stopped while waiting for the third token, not after all ten.
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn the_runtime_crashes_on_the_configured_request_and_stays_crashed() {
    let runtime = load(&StubBackend::new(), json!({ "crash_after_requests": 2 })).await;
    generate(&runtime, text("hi", None, &[])).await.1.unwrap();
    assert_eq!(runtime.health().await, Ok(()));
    let crashed = RuntimeError::Crashed { reason: "stub: injected crash on request 2".into() };
    assert_eq!(generate(&runtime, text("hi", None, &[])).await.1, Err(crashed.clone()));
    assert_eq!(generate(&runtime, text("hi", None, &[])).await.1, Err(crashed.clone()));
    assert_eq!(
        runtime.embed(EmbedRequest { inputs: vec!["x".into()] }).await,
        Err(crashed.clone())
    );
    assert_eq!(runtime.health().await, Err(crashed));
}

#[tokio::test(start_paused = true)]
async fn not_found_fails_at_once_and_fail_load_after_the_delay() {
    let backend = StubBackend::new();
    let start = Instant::now();
    let err = backend
        .load(request(&stub_model(json!({ "not_found": true, "load_delay_ms": 1000 }))))
        .await
        .err()
        .unwrap();
    assert!(err.is_not_found(), "{err:?}");
    assert!(matches!(&err, LoadError::NotFound { path, .. } if path == "stubby"));
    assert_eq!(start.elapsed(), Duration::ZERO);

    let with_path = model(json!({
        "backend": "stub", "model_path": "/models/missing.gguf", "stub": { "not_found": true }
    }));
    let err = backend.load(request(&with_path)).await.err().unwrap();
    assert!(matches!(&err, LoadError::NotFound { path, .. } if path == "/models/missing.gguf"));

    let start = Instant::now();
    let err = backend
        .load(request(&stub_model(json!({ "fail_load": "out of memory", "load_delay_ms": 1000 }))))
        .await
        .err()
        .unwrap();
    assert_eq!(err, LoadError::Failed { message: "out of memory".into() });
    assert!(!err.is_not_found());
    assert_eq!(start.elapsed(), Duration::from_millis(1000));
    assert_eq!(backend.loads_started(), 3);
    assert_eq!(backend.live_runtimes(), 0);
}

#[tokio::test(start_paused = true)]
async fn load_waits_the_delay_and_reports_progress() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let progress = {
        let seen = Arc::clone(&seen);
        ProgressSink::new(move |p| seen.lock().unwrap().push(p))
    };
    let model = stub_model(json!({ "load_delay_ms": 2500 }));
    let start = Instant::now();
    StubBackend::new()
        .load(LoadRequest { progress, ..LoadRequest::new(model, 1, 2) })
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(2500));
    assert_eq!(*seen.lock().unwrap(), [0.0, 1.0]);
}

#[tokio::test(start_paused = true)]
async fn live_runtimes_counts_loaded_replicas_until_unload_or_drop() {
    let backend = StubBackend::new();
    let a = load(&backend, json!({ "unload_delay_ms": 300 })).await;
    let b = load(&backend.clone(), json!({})).await;
    assert_eq!((backend.live_runtimes(), backend.loads_started()), (2, 2));

    let start = Instant::now();
    a.unload().await;
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(backend.live_runtimes(), 1);
    // A second unload, and dropping an unloaded runtime, count nothing twice.
    a.unload().await;
    drop(a);
    assert_eq!(backend.live_runtimes(), 1);
    // Dropped without unload.
    drop(b);
    assert_eq!(backend.live_runtimes(), 0);
}

#[tokio::test(start_paused = true)]
async fn embeddings_are_unit_vectors_derived_from_the_input() {
    let backend = StubBackend::new();
    let model = model(json!({ "backend": "stub", "labels": ["embedding"] }));
    let runtime = backend.load(request(&model)).await.unwrap();
    let inputs = vec!["hello world".to_owned(), "a b c".to_owned(), "hello world".to_owned()];
    let out = runtime.embed(EmbedRequest { inputs: inputs.clone() }).await.unwrap();
    assert_eq!(out.vectors.len(), 3);
    assert_eq!(out.prompt_tokens, 7);
    for v in &out.vectors {
        assert_eq!(v.len(), hangar_stub::EMBEDDING_DIM);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
    assert_eq!(out.vectors[0], out.vectors[2]);
    assert_ne!(out.vectors[0], out.vectors[1]);
    let again = runtime.embed(EmbedRequest { inputs }).await.unwrap();
    assert_eq!(again, out);
}

#[tokio::test(start_paused = true)]
async fn rerank_puts_the_matching_document_first() {
    let model = model(json!({ "backend": "stub", "type": "reranking" }));
    let runtime = StubBackend::new().load(request(&model)).await.unwrap();
    let request = RerankRequest {
        query: "Rust async runtime".into(),
        documents: vec![
            "a recipe for bread".into(),
            "The rust ASYNC runtime, explained.".into(),
            "gardening tips for spring".into(),
            "async cooking".into(),
        ],
    };
    let out = runtime.rerank(request.clone()).await.unwrap();
    assert_eq!(out.scores.len(), 4);
    let best = (0..4).max_by(|&i, &j| out.scores[i].total_cmp(&out.scores[j])).unwrap();
    assert_eq!(best, 1);
    assert!((3.0..3.5).contains(&out.scores[1]), "{:?}", out.scores);
    assert!((1.0..1.5).contains(&out.scores[3]), "{:?}", out.scores);
    assert!((0.0..0.5).contains(&out.scores[0]), "{:?}", out.scores);
    assert_eq!(out.prompt_tokens, 3 + 4 + 5 + 4 + 2);
    assert_eq!(runtime.rerank(request).await.unwrap(), out);
}

#[tokio::test(start_paused = true)]
async fn calls_a_model_type_does_not_serve_are_unsupported() {
    let backend = StubBackend::new();
    let llm = load(&backend, json!({ "crash_after_requests": 1 })).await;
    let unsupported =
        |r: Result<_, RuntimeError>| matches!(r, Err(RuntimeError::Unsupported { .. }));
    assert!(unsupported(llm.embed(EmbedRequest { inputs: vec!["x".into()] }).await.map(drop)));
    let rerank = RerankRequest { query: "q".into(), documents: vec!["d".into()] };
    assert!(unsupported(llm.rerank(rerank).await.map(drop)));
    // Rejected calls are not requests served: the first generate is still request 1.
    assert!(matches!(
        generate(&llm, text("hi", None, &[])).await.1,
        Err(RuntimeError::Crashed { reason }) if reason.ends_with("request 1")
    ));

    let embedder = model(json!({ "backend": "stub", "labels": ["embedding"] }));
    let embedder = backend.load(request(&embedder)).await.unwrap();
    assert!(unsupported(generate(&embedder, text("hi", None, &[])).await.1.map(drop)));
}

#[tokio::test(start_paused = true)]
async fn capabilities_come_from_the_stub_section() {
    let backend = StubBackend::new();
    let plain = stub_model(json!({}));
    let caps = backend.capabilities(&plain);
    assert_eq!(caps.thinking_modes, [ThinkingMode::Default]);
    assert!(caps.multi_turn);
    assert_eq!(caps.max_parallel_sequences, None);

    let thinking = stub_model(json!({ "thinking": true, "max_parallel_sequences": 4 }));
    let caps = backend.capabilities(&thinking);
    assert_eq!(
        caps.thinking_modes,
        [ThinkingMode::Default, ThinkingMode::Enabled, ThinkingMode::Disabled]
    );
    assert_eq!(caps.max_parallel_sequences.map(|n| n.get()), Some(4));
    let runtime = backend.load(request(&thinking)).await.unwrap();
    assert_eq!(runtime.capabilities(), &caps);
}

#[tokio::test(start_paused = true)]
async fn chat_prompts_count_the_words_of_every_message() {
    let runtime = load(&StubBackend::new(), json!({ "reply": "ok" })).await;
    let chat = GenerateRequest {
        prompt: Prompt::Chat(vec![
            ChatMessage::new(Role::System, "be brief"),
            ChatMessage::new(Role::User, "what is a hangar"),
        ]),
        params: SamplingParams::default(),
        thinking: ThinkingMode::Default,
        translation: None,
        tools: None,
        format: None,
        resume: None,
    };
    assert_eq!(generate(&runtime, chat).await.1.unwrap().prompt_tokens, 6);
    // An empty prompt still counts one token.
    assert_eq!(generate(&runtime, text("", None, &[])).await.1.unwrap().prompt_tokens, 1);
}

#[tokio::test(start_paused = true)]
async fn with_kind_stands_in_for_another_backend() {
    let backend = StubBackend::with_kind(BackendKind::LlamaCpp);
    assert_eq!(backend.kind(), BackendKind::LlamaCpp);
    let configured =
        model(json!({ "backend": "llama_cpp", "model_path": "/m/x.gguf", "gguf_n_ctx": 4096 }));
    let patch = json!({ "gguf_n_ctx": 16384, "gguf_type_k": "q8_0", "gguf_type_v": "q8_0" });
    let patch = validate_load_override(&configured, patch.as_object().unwrap()).unwrap();
    let effective = Arc::new(patch.apply(&configured).unwrap());
    assert_eq!(effective.definition()["gguf_n_ctx"], 16384);
    let runtime = backend.load(request(&effective)).await.unwrap();
    assert_eq!(runtime.capabilities().thinking_modes, [ThinkingMode::Default]);
    generate(&runtime, text("hi", Some(3), &[])).await.1.unwrap();
    assert_eq!(backend.live_runtimes(), 1);

    // A model of another kind is refused.
    let err = backend.load(request(&stub_model(json!({})))).await.err().unwrap();
    assert!(matches!(err, LoadError::Refused { .. }), "{err:?}");
}

/// A request that asks for more tokens than the context holds stops when it is full, as an
/// engine does (a client asking for 2^32 tokens does not hold a slot for ever).
#[tokio::test(start_paused = true)]
async fn generation_stops_when_the_pretend_context_is_full() {
    let runtime = load(&StubBackend::new(), json!({})).await;
    let mut request = GenerateRequest::new(Prompt::Text("three words here".into()));
    request.params.max_tokens = Some(u32::MAX);
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let summary = runtime.generate(request, tx).await.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(summary.completion_tokens, hangar_stub::CONTEXT_WORDS - 3);
    let mut words = 0;
    while rx.try_recv().is_ok() {
        words += 1;
    }
    assert_eq!(words, hangar_stub::CONTEXT_WORDS - 3);
}
