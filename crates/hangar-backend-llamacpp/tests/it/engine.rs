//! The llama.cpp engine on the committed tiny GGUF fixtures (`fixtures/models/`): real loads,
//! real decoding, random weights.

use std::sync::{Arc, Mutex};

use hangar_backend::{
    Backend, ChatMessage, EmbedRequest, FinishReason, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, LoadRequest, ProgressSink, Prompt, RerankRequest, Role, Runtime,
    RuntimeError, SamplingParams,
};
use hangar_backend_llamacpp::LlamaCppBackend;
use hangar_config::ModelConfig;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support;
use crate::support::fixture;
use crate::support::tiny as model;

/// llama.cpp initialises once per process; every test shares it.
fn backend() -> LlamaCppBackend {
    LlamaCppBackend::new(support::llama())
}

fn request(model: Arc<ModelConfig>, replica: u32) -> LoadRequest {
    support::load_request(model, replica, replica + 1)
}

async fn load(extra: Value) -> Arc<dyn Runtime> {
    backend().load(request(model(extra), 0)).await.expect("fixture loads")
}

/// A greedy (`temperature: 0`) completion of `prompt`: the engine samples by default.
fn text(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ..Default::default()
        },
        ..GenerateRequest::new(Prompt::Text(prompt.to_owned()))
    }
}

async fn generate(
    runtime: &dyn Runtime,
    request: GenerateRequest,
) -> (Result<GenerateSummary, RuntimeError>, Vec<String>) {
    let (tx, mut rx) = mpsc::channel(1024);
    let result = runtime.generate(request, tx).await;
    let mut pieces = Vec::new();
    while let Some(GenerateEvent::Text(piece)) = rx.recv().await {
        pieces.push(piece);
    }
    (result, pieces)
}

#[tokio::test(flavor = "multi_thread")]
async fn generation_stops_at_max_tokens_with_finish_reason_length() {
    let runtime = load(json!({})).await;
    let (summary, pieces) = generate(&*runtime, text("hello world", 8)).await;
    let summary = summary.expect("generates");
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(summary.completion_tokens, 8);
    assert!(summary.prompt_tokens >= 2, "BOS plus the prompt: {summary:?}");
    assert!(!pieces.is_empty());
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streamed_pieces_concatenate_to_the_same_text_every_greedy_run() {
    let runtime = load(json!({})).await;
    let (first, pieces) = generate(&*runtime, text("the model", 16)).await;
    let (second, again) = generate(&*runtime, text("the model", 16)).await;
    let (first, second) = (first.unwrap(), second.unwrap());
    // The repeat reuses the prompt's KV cells (all but the last token) and answers the same.
    assert_eq!((first.cached_tokens, second.cached_tokens), (0, first.prompt_tokens - 1));
    assert_eq!(GenerateSummary { cached_tokens: 0, ..second }, first);
    assert!(pieces.len() > 1, "one event per token: {pieces:?}");
    assert_eq!(pieces.concat(), again.concat());
    assert!(!pieces.concat().is_empty());
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn seeded_sampling_is_reproducible() {
    let runtime = load(json!({})).await;
    let sampled = |seed| {
        let mut r = text("hello", 12);
        r.params.temperature = Some(1.0);
        r.params.top_p = Some(0.9);
        r.params.top_k = Some(40);
        r.params.seed = Some(seed);
        r
    };
    let (a, pa) = generate(&*runtime, sampled(7)).await;
    let (b, pb) = generate(&*runtime, sampled(7)).await;
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(GenerateSummary { cached_tokens: 0, ..b }, a);
    assert_eq!(pa.concat(), pb.concat());
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_sequence_ends_generation_before_it() {
    let runtime = load(json!({})).await;
    let (unstopped, pieces) = generate(&*runtime, text("abc", 24)).await;
    assert_eq!(unstopped.unwrap().stop_sequence, None);
    let full = pieces.concat();
    // Stop at the text's second character: what comes out is only the first.
    let cut: String = full.chars().skip(1).take(1).collect();
    let mut request = text("abc", 24);
    request.params.stop = vec!["\u{1}never".to_owned(), cut.clone()];
    let (summary, pieces) = generate(&*runtime, request).await;
    let summary = summary.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Stop);
    assert_eq!(summary.stop_sequence, Some(1), "the second sequence stopped it");
    let out = pieces.concat();
    assert!(!out.contains(&cut) && full.starts_with(&out), "{out:?} vs {full:?} cut at {cut:?}");
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn counting_a_prompt_gives_the_usage_of_its_generation() {
    let runtime = load(json!({})).await;
    let request = GenerateRequest {
        prompt: Prompt::Chat(vec![
            ChatMessage::new(Role::System, "be brief"),
            ChatMessage::new(Role::User, "count these words, please"),
        ]),
        ..text("", 2)
    };
    let counted = runtime.count_tokens(request.clone()).await.unwrap();
    let (summary, _) = generate(&*runtime, request).await;
    assert_eq!(counted, summary.unwrap().prompt_tokens);
    assert!(counted > 5, "{counted}");
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_prompts_use_the_embedded_template() {
    let runtime = load(json!({})).await;
    let chat = |content: &str| GenerateRequest {
        prompt: Prompt::Chat(vec![
            ChatMessage::new(Role::System, "be brief"),
            ChatMessage::new(Role::User, content),
        ]),
        ..text("", 4)
    };
    let (summary, _) = generate(&*runtime, chat("hi")).await;
    let (raw, _) = generate(&*runtime, text("hi", 4)).await;
    // ChatML wraps the message: many more prompt tokens than the bare text.
    assert!(summary.unwrap().prompt_tokens > raw.unwrap().prompt_tokens + 4);
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_receiver_cancels_and_the_runtime_stays_usable() {
    let runtime = load(json!({})).await;
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let result = runtime.generate(text("hello", 64), tx).await;
    assert_eq!(result, Err(RuntimeError::Cancelled));

    // A receiver that goes away mid-stream.
    let (tx, mut rx) = mpsc::channel(1);
    let reader = tokio::spawn(async move {
        let first = rx.recv().await;
        drop(rx);
        first
    });
    let result = runtime.generate(text("hello", 64), tx).await;
    assert!(reader.await.unwrap().is_some());
    assert_eq!(result, Err(RuntimeError::Cancelled));

    let (summary, _) = generate(&*runtime, text("hello", 3)).await;
    assert_eq!(summary.unwrap().completion_tokens, 3);
    runtime.health().await.unwrap();
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_file_is_not_found() {
    let err = backend()
        .load(request(model(json!({ "model_path": "/nonexistent/tiny.gguf" })), 0))
        .await
        .err()
        .expect("fails");
    assert!(err.is_not_found(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_file_is_a_load_failure_with_llama_cpps_reason() {
    let dir = std::env::temp_dir().join(format!("hangar-llamacpp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("garbage.gguf");
    std::fs::write(&path, b"this is not a gguf file at all, just garbage bytes\n".repeat(20))
        .unwrap();
    let err = backend()
        .load(request(model(json!({ "model_path": path.to_str().unwrap() })), 0))
        .await
        .err()
        .expect("fails");
    std::fs::remove_dir_all(&dir).ok();
    let LoadError::Failed { message } = &err else { panic!("expected Failed, got {err:?}") };
    eprintln!("llama.cpp reason: {message}");
    assert!(message.contains("gguf") || message.contains("magic"), "{message}");
    assert!(!message.contains("null result"), "llama.cpp's reason, not the wrapper's: {message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_placement_names_llamas_devices_and_a_gpu_it_lacks_fails_the_load() {
    // This build's devices (the CPU in CI; CUDA ones with the `cuda` feature on a GPU).
    let gpus = llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| matches!(d.device_type, llama_cpp_2::LlamaBackendDeviceType::Gpu))
        .count() as u32;
    let on = |gpu: u32| LoadRequest { gpus: vec![gpu], ..request(model(json!({})), 0) };
    let err = backend().load(on(gpus)).await.err().expect("no such GPU");
    let LoadError::Refused { message } = &err else { panic!("expected Refused, got {err:?}") };
    assert!(message.contains(&format!("GPU {gpus} is not a device llama.cpp sees")), "{message}");
    if gpus > 0 {
        // On a GPU build the last GPU takes the whole model.
        let runtime = backend().load(on(gpus - 1)).await.expect("loads on its GPU");
        runtime.unload().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn load_reports_progress_up_to_one() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = Arc::clone(&seen);
        ProgressSink::new(move |p| seen.lock().unwrap().push(p))
    };
    let runtime = backend()
        .load(LoadRequest { progress: sink, ..LoadRequest::new(model(json!({})), 0, 1) })
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.first(), Some(&0.0));
    assert_eq!(seen.last(), Some(&1.0));
    assert!(seen.len() > 2, "llama.cpp's own progress in between: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unload_then_reload_serves_again() {
    for _ in 0..3 {
        let runtime = load(json!({})).await;
        let (summary, _) = generate(&*runtime, text("hello", 2)).await;
        assert_eq!(summary.unwrap().completion_tokens, 2);
        runtime.unload().await;
        assert!(runtime.health().await.is_err(), "unloaded runtimes are not healthy");
        let (after, _) = generate(&*runtime, text("hello", 2)).await;
        assert!(after.is_err());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gguf_overrides_are_applied_to_the_context() {
    let model = model(json!({
        "gguf_n_ctx": 256,
        "gguf_n_batch": 32,
        "gguf_n_threads": 1,
        "gguf_n_gpu_layers": 0,
        "gguf_flash_attn": "off",
        "gguf_type_k": "q8_0",
        "gguf_type_v": "f16",
    }));
    let runtime = backend().load_replica(request(model, 0)).await.unwrap();
    let info = runtime.info();
    assert_eq!((info.n_ctx, info.n_batch), (256, 32), "{info:?}");
    assert_eq!(info.n_ctx_train, 2048);
    // A longer prompt is refused with the context's size.
    let long = "hello world ".repeat(200);
    let (result, _) = generate(&*runtime, text(&long, 4)).await;
    match result {
        Err(RuntimeError::InvalidRequest { message }) => {
            assert!(message.ends_with("the context holds 256"), "{message}")
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    // Generation stops at the context's end.
    let (summary, _) = generate(&*runtime, text("hello", 1000)).await;
    let summary = summary.unwrap();
    assert_eq!(summary.finish_reason, FinishReason::Length);
    assert_eq!(summary.prompt_tokens + summary.completion_tokens, 256);
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_gguf_n_ctx_the_context_is_the_training_context() {
    let runtime = backend().load_replica(request(model(json!({})), 0)).await.unwrap();
    assert_eq!(runtime.info().n_ctx, 2048);
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn configured_prompt_formats_render_through_the_prompt_module() {
    let chat = GenerateRequest {
        prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, "hi")]),
        ..text("", 2)
    };
    let generic = load(json!({ "prompt_format": "generic" })).await;
    let (summary, _) = generate(&*generic, chat.clone()).await;
    // "User: hi\nAssistant:" is more than BOS + "hi".
    assert!(summary.unwrap().prompt_tokens > 3);
    generic.unload().await;

    let translate = load(json!({ "prompt_format": "translategemma_template" })).await;
    assert!(!translate.capabilities().multi_turn);
    let (result, _) = generate(&*translate, chat).await;
    assert!(matches!(result, Err(RuntimeError::InvalidRequest { .. })), "no target: {result:?}");
    translate.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_generate_concurrently() {
    let backend = backend();
    let model = model(json!({}));
    let a = backend.load(request(Arc::clone(&model), 0)).await.unwrap();
    let b = backend.load(request(model, 1)).await.unwrap();
    let (ra, rb) = tokio::join!(generate(&*a, text("hello", 32)), generate(&*b, text("hello", 32)));
    let (ra, rb) = (ra.0.unwrap(), rb.0.unwrap());
    assert_eq!(ra, rb, "same weights, same greedy output");
    assert_eq!(ra.completion_tokens, 32);
    a.unload().await;
    b.health().await.expect("unloading one replica leaves the other");
    b.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn embeddings_are_normalized_and_deterministic() {
    let runtime = backend()
        .load(request(
            model(json!({ "model_path": fixture("tiny-embed.gguf"), "type": "embedding" })),
            0,
        ))
        .await
        .unwrap();
    let inputs = vec!["hello world".to_owned(), "the quick brown fox".to_owned()];
    let first = runtime.embed(EmbedRequest { inputs: inputs.clone() }).await.unwrap();
    let second = runtime.embed(EmbedRequest { inputs }).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(first.vectors.len(), 2);
    assert!(first.prompt_tokens > 0);
    for v in &first.vectors {
        assert_eq!(v.len(), 64);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    assert_ne!(first.vectors[0], first.vectors[1]);
    let (result, _) = generate(&*runtime, text("hi", 2)).await;
    assert!(matches!(result, Err(RuntimeError::Unsupported { .. })), "{result:?}");
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rerank_scores_every_document_deterministically() {
    let runtime = backend()
        .load(request(
            model(json!({ "model_path": fixture("tiny-rerank.gguf"), "type": "reranking" })),
            0,
        ))
        .await
        .unwrap();
    let req = RerankRequest {
        query: "what is a fox".into(),
        documents: vec!["a fox is an animal".into(), "paris is in france".into(), "x".into()],
    };
    let first = runtime.rerank(req.clone()).await.unwrap();
    let second = runtime.rerank(req).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(first.scores.len(), 3);
    assert!(first.scores.iter().all(|s| s.is_finite()));
    assert_ne!(first.scores[0], first.scores[1]);
    assert!(matches!(
        runtime.embed(EmbedRequest { inputs: vec!["x".into()] }).await,
        Err(RuntimeError::Unsupported { .. })
    ));
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_one_copy_of_the_weights_until_the_last_one_goes() {
    let backend = backend();
    let model = model(json!({}));
    // Loaded concurrently, the second waits for the first's weights instead of loading its own.
    let (a, b) = tokio::join!(
        backend.load_replica(request(Arc::clone(&model), 0)),
        backend.load_replica(request(Arc::clone(&model), 1))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.shares_weights_with(&b));
    // Other settings that change the weights (GPU layers) get their own copy.
    let offloaded =
        backend.load_replica(request(self::model(json!({ "gguf_n_gpu_layers": 0 })), 0));
    let offloaded = offloaded.await.unwrap();
    assert!(!offloaded.shares_weights_with(&a));
    // Each replica still has its own context: both decode at once, identically.
    let (ra, rb) = tokio::join!(generate(&*a, text("hello", 16)), generate(&*b, text("hello", 16)));
    assert_eq!(ra.0.unwrap(), rb.0.unwrap());
    assert_eq!(ra.1, rb.1);

    a.unload().await;
    assert!(b.shares_weights_with(&b), "the other replica keeps the weights alive");
    let c = backend.load_replica(request(Arc::clone(&model), 2)).await.unwrap();
    assert!(c.shares_weights_with(&b), "a new replica joins the loaded weights");
    b.unload().await;
    c.unload().await;
    assert!(!c.shares_weights_with(&c), "unloading the last replica frees the weights");
    let d = backend.load_replica(request(model, 0)).await.unwrap();
    let (summary, _) = generate(&*d, text("hello", 4)).await;
    assert_eq!(summary.unwrap().completion_tokens, 4, "fresh weights load and serve");
    d.unload().await;
    offloaded.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_configured_context_is_the_limit_even_when_llama_cpp_pads_it() {
    // llama.cpp rounds n_ctx up to a multiple of 256; requests still get the 64 asked for.
    let runtime = load(json!({ "gguf_n_ctx": 64 })).await;
    let (result, _) = generate(&*runtime, text(&"hello world ".repeat(40), 4)).await;
    match result {
        Err(RuntimeError::InvalidRequest { message }) => {
            assert!(message.ends_with("the context holds 64"), "{message}");
        }
        other => panic!("a prompt longer than gguf_n_ctx must be refused: {other:?}"),
    }
    // Prompt plus completion stop at 64 tokens.
    let (summary, _) = generate(&*runtime, text("hello", 200)).await;
    let summary = summary.unwrap();
    if summary.finish_reason == FinishReason::Length {
        assert_eq!(summary.prompt_tokens + summary.completion_tokens, 64, "{summary:?}");
    }
    runtime.unload().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_max_tokens_generation_runs_until_the_model_stops_or_the_context_is_full() {
    // No 128-token (or any) default cut: a request without max_tokens ends at end-of-generation
    // or, as OpenAI and llama-server do, with `length` once the context is full. Greedy
    // decoding (asked for: the engine samples by default, and a sampled run on random weights
    // may end early on every prompt) ends by itself after some prompts, so the prompts are tried
    // in turn until one fills the context; every one must end one of the two ways.
    let runtime = load(json!({ "gguf_n_ctx": 256 })).await;
    let chat = |text: &str| Prompt::Chat(vec![ChatMessage::new(Role::User, text)]);
    let text = |text: &str| Prompt::Text(text.to_owned());
    let prompts = [
        chat("hello"),
        text("hello"),
        text("the model"),
        text("abc"),
        chat("tell me a long story"),
        text("once upon a time"),
        text("1 2 3 4"),
        text("the quick brown fox"),
    ];
    let mut filled = None;
    for prompt in prompts {
        let mut request = GenerateRequest::new(prompt.clone());
        assert_eq!(request.params.max_tokens, None);
        request.params.temperature = Some(0.0);
        let (summary, pieces) = generate(&*runtime, request).await;
        let summary = summary.expect("a full context ends the generation, it is no error");
        eprintln!("{prompt:?}: {summary:?}");
        let used = summary.prompt_tokens + summary.completion_tokens;
        match summary.finish_reason {
            FinishReason::Length => {
                assert_eq!(used, 256, "length means the context is full: {summary:?}");
                assert!(!pieces.is_empty());
                filled = Some(summary);
                break;
            }
            FinishReason::Stop => assert!(used < 256, "{summary:?}"),
            other => panic!("expected length or stop, got {other:?}"),
        }
    }
    let summary = filled.expect("some prompt runs until the context is full");
    assert!(summary.completion_tokens > 128, "{summary:?}");
    runtime.unload().await;
}
