//! Memory returns after unload. The measurement reads this process's RSS, which any other
//! test loading a model would move, and the tests of this binary share one process: so the
//! test runs itself again, alone, in a child process of this binary, and measures there.

use std::sync::Arc;

use hangar_backend::{Backend, GenerateRequest, Prompt, SamplingParams};
use hangar_backend_llamacpp::LlamaCppBackend;
use serde_json::json;
use tokio::sync::mpsc;

use crate::support;

/// Set in the child process that measures: there the test runs alone.
const ALONE: &str = "HANGAR_LLAMACPP_MEMORY_TEST_ALONE";

#[test]
fn fifty_load_unload_cycles_return_memory() {
    support::alone(ALONE, module_path!(), "fifty_load_unload_cycles_return_memory", fifty_cycles);
}

/// Fifty load / generate / unload cycles after five to warm up: RSS grows by less than one
/// replica's worth per cycle would add.
async fn fifty_cycles() {
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
    let before = support::rss_bytes();
    for _ in 0..50 {
        cycle().await;
    }
    let after = support::rss_bytes();
    let growth = after.saturating_sub(before);
    // One replica (weights + a 2048-token KV cache) is about 2 MiB; a leak of one per cycle
    // would be 100 MiB.
    assert!(growth < 16 << 20, "RSS grew by {} KiB over 50 cycles", growth >> 10);
}
