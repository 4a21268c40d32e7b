//! Memory returns after unload. The measurement reads this process's RSS, which any other
//! test loading a model would move, and the tests of this binary share one process: so the
//! test runs itself again, alone, in a child process of this binary, and measures there.

use std::process::Command;
use std::sync::Arc;

use hangar_backend::{Backend, GenerateRequest, Prompt, SamplingParams};
use hangar_backend_llamacpp::LlamaCppBackend;
use serde_json::json;
use tokio::sync::mpsc;

use crate::support;

/// Set in the child process that measures: there the test runs alone.
const ALONE: &str = "HANGAR_LLAMACPP_MEMORY_TEST_ALONE";

/// Resident set size in bytes (Linux), from `/proc/self/statm`.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn fifty_load_unload_cycles_return_memory() {
    if std::env::var_os(ALONE).is_some() {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        return runtime.block_on(fifty_cycles());
    }
    // This test's name in the binary (the crate name `it` is not part of it).
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::fifty_load_unload_cycles_return_memory");
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the measuring child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the child did not run {name}:\n{stdout}");
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
