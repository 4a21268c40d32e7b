//! Memory returns after unload: its own test binary, so that no other test loads models
//! while it measures the process's RSS.

mod support;

use std::sync::Arc;

use hangar_backend::{Backend, GenerateRequest, Prompt, SamplingParams};
use hangar_backend_llamacpp::LlamaCppBackend;
use serde_json::json;
use tokio::sync::mpsc;

/// Resident set size in bytes (Linux), from `/proc/self/statm`.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_load_unload_cycles_return_memory() {
    let backend = LlamaCppBackend::new(support::llama());
    let model = support::tiny(json!({}));
    let cycle = || async {
        let request = support::load_request(Arc::clone(&model), 0, 1);
        let runtime = backend.load(request).await.unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let generate = GenerateRequest {
            params: SamplingParams { max_tokens: Some(2), ..Default::default() },
            ..GenerateRequest::new(Prompt::Text("hello".into()))
        };
        runtime.generate(generate, tx).await.unwrap();
        while rx.recv().await.is_some() {}
        runtime.unload().await;
    };
    // Warm up allocator pools and llama.cpp's one-time state first.
    for _ in 0..5 {
        cycle().await;
    }
    let Some(before) = rss_bytes() else { return };
    for _ in 0..50 {
        cycle().await;
    }
    let after = rss_bytes().unwrap();
    let growth = after.saturating_sub(before);
    // One replica (weights + a 2048-token KV cache) is about 2 MiB; a leak of one per cycle
    // would be 100 MiB.
    assert!(growth < 16 << 20, "RSS grew by {} KiB over 50 cycles", growth >> 10);
}
