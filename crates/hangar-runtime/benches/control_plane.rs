//! Control-plane benchmark: throughput through the scheduler, admission overhead, the
//! control loop's command throughput, and load+unload cycle time, each next to a reference
//! measured in the same run.
//!
//! Run with `cargo xtask bench control-plane`. Prints one table; no assertions.
#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hangar_backend::{
    Backend, GenerateRequest, LoadRequest, Prompt, Runtime, SamplingParams, ThinkingMode,
};
use hangar_config::Config;
use hangar_runtime::{Backends, LoadOptions, Manager};
use hangar_stub::StubBackend;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

const WINDOW: Duration = Duration::from_millis(1500);

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Text("benchmark prompt".into()),
        params: SamplingParams { max_tokens: Some(1), ..SamplingParams::default() },
        thinking: ThinkingMode::Default,
        translation: None,
        tools: None,
        format: None,
        resume: None,
    }
}

fn config() -> Config {
    Config::from_value(&json!({
        "max_queue_depth": 4096,
        "models": {
            "chat": { "backend": "stub", "target_inflight": 64, "stub": { "token_latency_ms": 0 } },
            "cycle": { "backend": "stub", "stub": { "load_delay_ms": 0 } }
        }
    }))
    .expect("bench config")
}

/// Requests per second with `callers` concurrent loops over `call` for `WINDOW`.
async fn throughput<F, Fut>(callers: usize, call: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (call, done) = (call.clone(), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < WINDOW {
                call().await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Turns per second and the p99 of one turn's latency in µs, with `callers` concurrent
/// loops of `TURNS` calls each.
async fn turns<F, Fut>(callers: usize, call: F) -> (f64, f64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    const TURNS: usize = 20_000;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(TURNS);
            for _ in 0..TURNS {
                let at = Instant::now();
                call().await;
                latencies.push(at.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("caller"));
    }
    let rate = latencies.len() as f64 / start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let p99 = latencies[latencies.len() * 99 / 100].as_secs_f64() * 1e6;
    (rate, p99)
}

async fn generate_via(runtime: &Arc<dyn Runtime>) {
    let (tx, mut rx) = mpsc::channel(8);
    let summary = runtime.generate(request(), tx).await;
    while rx.try_recv().is_ok() {}
    summary.expect("generate");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let config = config();
    let stub = Arc::new(StubBackend::new());
    let manager = Manager::new(&config, Backends::new().with(stub.clone()));
    manager.load("chat", LoadOptions::default()).await.expect("load chat");

    // Reference runtime: the same stub, called directly without the manager.
    let model = Arc::new(config.model("chat").expect("chat").clone());
    let direct: Arc<dyn Runtime> =
        stub.load(LoadRequest::new(model, 0, 1)).await.expect("direct load");

    println!("control-plane benchmark (stub backend, zero token latency, 1 token per request)");
    println!();
    println!("{:<44} {:>14} {:>14} {:>8}", "measure", "hangar", "reference", "ratio");
    for callers in [1usize, 8, 64] {
        let m = manager.clone();
        let via_manager = throughput(callers, move || {
            let m = m.clone();
            async move {
                let (tx, mut rx) = mpsc::channel(8);
                m.generate("chat", request(), tx).await.expect("generate");
                while rx.try_recv().is_ok() {}
            }
        })
        .await;
        let d = Arc::clone(&direct);
        let reference = throughput(callers, move || {
            let d = Arc::clone(&d);
            async move { generate_via(&d).await }
        })
        .await;
        println!(
            "{:<44} {:>14.0} {:>14.0} {:>8.2}",
            format!("requests/s, {callers} concurrent callers"),
            via_manager,
            reference,
            via_manager / reference
        );
    }

    // Admission: the work check, acquire and release of one in-flight slot, one caller.
    let work = hangar_runtime::Work::Generate {
        thinking: hangar_backend::ThinkingMode::Default,
        user_turns: 1,
    };
    let n = 200_000u32;
    let start = Instant::now();
    for _ in 0..n {
        drop(manager.admit("chat", work).await.expect("admit"));
    }
    let admission_ns = start.elapsed().as_nanos() as f64 / f64::from(n);
    let semaphore = Semaphore::new(64);
    let start = Instant::now();
    for _ in 0..n {
        drop(semaphore.acquire().await.expect("semaphore"));
    }
    let semaphore_ns = start.elapsed().as_nanos() as f64 / f64::from(n);
    println!(
        "{:<44} {:>14.0} {:>14.0} {:>8.2}",
        "admission ns/request (ref: tokio Semaphore)",
        admission_ns,
        semaphore_ns,
        admission_ns / semaphore_ns
    );

    // The control loop: a `resume` of a model that is not paused is one admin operation,
    // three commands (an `Admin` turn, a `Move` the loop refuses — nothing to resume — and
    // the turn's `Done`), two round trips, around a snapshot. Reference: the same snapshot
    // under a tokio mutex, what the per-model admin lock was.
    for callers in [1usize, 8] {
        let m = manager.clone();
        let (loop_rate, loop_p99) = turns(callers, move || {
            let m = m.clone();
            async move {
                m.resume("chat").await.expect("resume");
            }
        })
        .await;
        let (m, lock) = (manager.clone(), Arc::new(tokio::sync::Mutex::new(())));
        let (lock_rate, lock_p99) = turns(callers, move || {
            let (m, lock) = (m.clone(), Arc::clone(&lock));
            async move {
                let _held = lock.lock().await;
                m.model("chat").expect("snapshot");
            }
        })
        .await;
        println!(
            "{:<44} {:>14.0} {:>14.0} {:>8.2}",
            format!("loop commands/s, {callers} callers (ref: mutex)"),
            loop_rate * 3.0,
            lock_rate * 3.0,
            loop_rate / lock_rate
        );
        println!(
            "{:<44} {:>14.1} {:>14.1} {:>8.2}",
            format!("admin op p99 µs, {callers} callers (ref: mutex)"),
            loop_p99,
            lock_p99,
            loop_p99 / lock_p99
        );
    }

    // Load + unload cycle of a stub model with no simulated delay.
    let cycles = 2_000u32;
    let start = Instant::now();
    for _ in 0..cycles {
        manager.load("cycle", LoadOptions::default()).await.expect("load");
        manager.unload("cycle").await.expect("unload");
    }
    let cycle_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(cycles);
    let cycle_model = Arc::new(config.model("cycle").expect("cycle").clone());
    let start = Instant::now();
    for _ in 0..cycles {
        let request = LoadRequest::new(Arc::clone(&cycle_model), 0, 1);
        stub.load(request).await.expect("load").unload().await;
    }
    let direct_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(cycles);
    println!(
        "{:<44} {:>14.1} {:>14.1} {:>8.2}",
        "load+unload cycle µs (ref: backend direct)",
        cycle_us,
        direct_us,
        cycle_us / direct_us
    );
}
