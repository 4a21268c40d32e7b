//! Use Hangar's control plane with no HTTP at all: a `Manager` from `hangar-runtime`,
//! loading a model, streaming a generation, reading the admin snapshot, unloading.
//!
//! `cargo run -p hangar-server --example embed_runtime`

use std::sync::Arc;

use hangar_backend::{GenerateEvent, GenerateRequest, Prompt, SamplingParams, ThinkingMode};
use hangar_runtime::{Backends, LoadOptions, Manager};
use hangar_stub::StubBackend;
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = hangar_config::Config::from_value(&serde_json::json!({
        "max_loaded_models": { "llm": 1 },
        "models": {
            "chat": { "backend": "stub", "replicas": 2, "stub": { "token_latency_ms": 20 } },
            "other": { "backend": "stub" }
        }
    }))?;
    let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    let mut changes = manager.subscribe();

    let snapshot = manager.load("chat", LoadOptions::default()).await?;
    println!("chat: {} with {} replicas", snapshot.runtime_state, snapshot.loaded_replicas);

    let (tx, mut rx) = mpsc::channel(16);
    let request = GenerateRequest {
        prompt: Prompt::Text("tell me about hangars".into()),
        params: SamplingParams { max_tokens: Some(8), ..SamplingParams::default() },
        thinking: ThinkingMode::Default,
        translation: None,
        tools: None,
        format: None,
        resume: None,
    };
    let generation = tokio::spawn({
        let manager = manager.clone();
        async move { manager.generate("chat", request, tx).await }
    });
    print!("tokens:");
    while let Some(GenerateEvent::Text(piece)) = rx.recv().await {
        print!("{piece}");
    }
    let summary = generation.await??;
    println!("\nfinish: {:?}, {} tokens", summary.finish_reason, summary.completion_tokens);

    // Loading another llm with a limit of 1 evicts the least recently used one.
    manager.load("other", LoadOptions::default()).await?;
    for m in manager.models() {
        println!("{:<6} {}", m.name(), m.runtime_state);
    }
    while let Ok(change) = changes.try_recv() {
        println!("  {}: {} -> {}", change.model, change.from, change.to);
    }
    manager.unload_all().await;
    println!("counters: {:?}", manager.counters());
    Ok(())
}
