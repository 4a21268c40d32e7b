//! `cargo xtask bench server`: the whole server under load, over loopback HTTP/1.1.
//!
//! Starts the release `hangard serve` on a temporary config of stub models (zero token
//! latency) and drives it from a tokio load generator with one keep-alive connection per
//! concurrent caller. Every figure is printed next to `GET /healthz` on the same server, at
//! the same concurrency, in the same run: the floor of routing, HTTP and the loopback
//! round trip, so the ratio is what the route itself costs.
//!
//! - `POST /v1/chat/completions` (`max_tokens: 1`, non-streaming) at 1 and 64 connections:
//!   requests/s, p50 and p99 latency;
//! - `GET /v1/admin/models` with 10 and with 1,000 configured models: p50 and p99.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Server;

const WARMUP: Duration = Duration::from_millis(300);
const RUN: Duration = Duration::from_secs(2);

/// What one load run measured.
struct Sample {
    elapsed: Duration,
    /// Sorted.
    latencies: Vec<Duration>,
}

impl Sample {
    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_us(&self, p: f64) -> f64 {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    }
}

/// One request shape.
#[derive(Clone)]
struct Target {
    url: String,
    body: Option<Value>,
}

impl Target {
    fn get(server: &Server, path: &str) -> Self {
        Self { url: server.url(path), body: None }
    }

    fn post(server: &Server, path: &str, body: Value) -> Self {
        Self { url: server.url(path), body: Some(body) }
    }

    async fn once(&self, client: &reqwest::Client) {
        let request = match &self.body {
            Some(body) => client.post(&self.url).json(body),
            None => client.get(&self.url),
        };
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let bytes = response.bytes().await.expect("the body reads");
        assert!(
            status.is_success(),
            "{} answered {status}: {}",
            self.url,
            String::from_utf8_lossy(&bytes)
        );
    }
}

/// `connections` callers, each on its own keep-alive connection, send requests back to back
/// for `duration`.
async fn drive(target: &Target, connections: usize, duration: Duration) -> Sample {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let target = target.clone();
        tasks.spawn(async move {
            let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                target.once(&client).await;
                latencies.push(t.elapsed());
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.expect("a load task"));
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Sample { elapsed, latencies }
}

async fn measure(target: &Target, connections: usize) -> Sample {
    drive(target, connections, WARMUP).await;
    drive(target, connections, RUN).await
}

struct Row {
    measure: String,
    hangar: Sample,
    reference: Sample,
}

async fn row(measure: String, target: &Target, reference: &Target, connections: usize) -> Row {
    let hangar = measure_logged(&measure, target, connections).await;
    let reference =
        measure_logged(&format!("{measure} (ref /healthz)"), reference, connections).await;
    Row { measure, hangar, reference }
}

async fn measure_logged(label: &str, target: &Target, connections: usize) -> Sample {
    let sample = measure(target, connections).await;
    eprintln!("  {label}: {} requests", sample.latencies.len());
    sample
}

fn stub_models(n: usize) -> Value {
    let models: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("model-{i:04}"), json!({ "backend": "stub" }))).collect();
    Value::Object(models)
}

async fn load(server: &Server, model: &str) {
    Target::post(server, &format!("/v1/admin/models/{model}/load"), json!({}))
        .once(&reqwest::Client::new())
        .await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        eprintln!("server with one stub chat model (token latency 0):");
        let config = json!({
            "max_queue_depth": 1024,
            "models": {
                "chat": { "backend": "stub", "target_inflight": 64, "stub": { "token_latency_ms": 0 } }
            }
        });
        let server = Server::start(&config, &["--log-format", "json"]);
        load(&server, "chat").await;
        let chat = Target::post(
            &server,
            "/v1/chat/completions",
            json!({
                "model": "chat",
                "messages": [{ "role": "user", "content": "hi" }],
                "max_tokens": 1
            }),
        );
        let healthz = Target::get(&server, "/healthz");
        for connections in [1, 64] {
            let label = format!("POST /v1/chat/completions, {connections} conn");
            rows.push(row(label, &chat, &healthz, connections).await);
        }
        drop(server);

        for n in [10, 1000] {
            eprintln!("server with {n} stub models:");
            let server = Server::start(&json!({ "models": stub_models(n) }), &["--log-format", "json"]);
            load(&server, "model-0000").await;
            let list = Target::get(&server, "/v1/admin/models");
            let healthz = Target::get(&server, "/healthz");
            rows.push(row(format!("GET /v1/admin/models, {n} models"), &list, &healthz, 1).await);
        }
        rows
    });
    print_table(&rows);
}

fn print_table(rows: &[Row]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "hangard serve (release), stub backend, loopback HTTP/1.1, {cores} cores shared by \
         server and load generator; {}s per figure",
        RUN.as_secs_f64()
    );
    println!();
    println!(
        "| measure | requests/s | p50 µs | p99 µs | ref requests/s | ref p50 µs | ref p99 µs | p50 ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (h, f) = (&r.hangar, &r.reference);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
            r.measure,
            h.per_second(),
            h.percentile_us(0.5),
            h.percentile_us(0.99),
            f.per_second(),
            f.percentile_us(0.5),
            f.percentile_us(0.99),
            h.percentile_us(0.5) / f.percentile_us(0.5),
        );
    }
    println!();
    println!("reference (ref): GET /healthz on the same server at the same concurrency");
}
