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
//! - `GET /v1/admin/models` with 10 and with 1,000 configured models: p50 and p99;
//! - with [`MANY`] (10,000) configured models (80% llm, 10% embedding, 10% reranking, one
//!   loaded): the admin list in full and filtered (`?state=loaded`, `?type=llm`), one model
//!   (`GET /v1/admin/models/{name}`), the model repository index (`POST
//!   /v2/repository/index`), `GET /api/v1/health`, `GET /metrics` and the routers' scrape
//!   `GET /metrics/node`: p50 and p99, each checked against the goal where there is one
//!   ([`LIST_P50_GOAL_US`], [`NODE_SCRAPE_GOAL_US`]);
//! - the server's resident memory (`VmRSS` of `/proc/<pid>/status`) with no model
//!   configured and with [`MANY`], after start-up (and the load of one model) and again
//!   after a dozen full `GET /v1/admin/models`: total MiB and KiB per configured model over
//!   the empty server, against [`RSS_START_UP_GOAL_KIB`] and [`RSS_AFTER_LISTS_GOAL_KIB`].
//!
//! Every request must answer 2xx: a route that answers anything else fails the bench.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Server;

const WARMUP: Duration = Duration::from_millis(300);
const RUN: Duration = Duration::from_secs(2);
/// Configured models of the large-config rows.
const MANY: usize = 10_000;
/// Goal: `GET /v1/admin/models` p50 at [`MANY`] models, in µs.
const LIST_P50_GOAL_US: f64 = 20_000.0;
/// Goal: what `GET /metrics/node` costs over `GET /healthz` at [`MANY`] models (p50), in µs:
/// an endpoint picker scrapes every 50 ms.
const NODE_SCRAPE_GOAL_US: f64 = 1_000.0;
/// Goal: resident memory per configured model after start-up, over the empty server, in KiB.
const RSS_START_UP_GOAL_KIB: f64 = 4.0;
/// Goal: the same after [`LISTS`] full lists.
const RSS_AFTER_LISTS_GOAL_KIB: f64 = 6.0;
/// Full lists served before the second memory reading.
const LISTS: usize = 12;

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

    fn method(&self) -> &'static str {
        if self.body.is_some() { "POST" } else { "GET" }
    }

    /// The path and query of the URL (`server`'s base taken off).
    fn path<'a>(&'a self, server: &Server) -> &'a str {
        self.url.strip_prefix(&server.base).unwrap_or(&self.url)
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

/// `n` stub models named `model-00000`, …: every tenth an embedding model, every tenth
/// (offset by one) a reranker, the rest llm.
fn stub_models(n: usize) -> Value {
    let models: serde_json::Map<String, Value> = (0..n)
        .map(|i| {
            let model = match i % 10 {
                1 => json!({ "backend": "stub", "labels": ["embedding"] }),
                2 => json!({ "backend": "stub", "labels": ["reranking"] }),
                _ => json!({ "backend": "stub" }),
            };
            (model_name(i), model)
        })
        .collect();
    Value::Object(models)
}

fn model_name(i: usize) -> String {
    format!("model-{i:05}")
}

/// The server's resident set size in KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(server: &Server) -> u64 {
    let path = format!("/proc/{}/status", server.pid());
    let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {path}"))
}

/// Starts a server on `models` and loads `model-00000` when there is one; the server and
/// its resident memory then, and after [`LISTS`] full lists.
async fn start_measured(models: usize) -> (Server, Rss) {
    let server =
        Server::start(&json!({ "models": stub_models(models) }), &["--log-format", "json"]);
    if models > 0 {
        load(&server, &model_name(0)).await;
    }
    let start_up_kib = rss_kib(&server);
    let client = reqwest::Client::new();
    for _ in 0..LISTS {
        Target::get(&server, "/v1/admin/models").once(&client).await;
    }
    let after_lists_kib = rss_kib(&server);
    (server, Rss { start_up_kib, after_lists_kib })
}

/// One server's resident memory, in KiB.
#[derive(Clone, Copy)]
struct Rss {
    start_up_kib: u64,
    after_lists_kib: u64,
}

/// Resident memory of the empty server and of the one with [`MANY`] models.
struct Memory {
    empty: Rss,
    many: Rss,
}

impl Memory {
    /// KiB per configured model over the empty server, after start-up and after the lists.
    fn per_model_kib(&self) -> (f64, f64) {
        let per = |many: u64, empty: u64| (many as f64 - empty as f64) / MANY as f64;
        (
            per(self.many.start_up_kib, self.empty.start_up_kib),
            per(self.many.after_lists_kib, self.empty.after_lists_kib),
        )
    }
}

async fn load(server: &Server, model: &str) {
    Target::post(server, &format!("/v1/admin/models/{model}/load"), json!({}))
        .once(&reqwest::Client::new())
        .await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (rows, memory) = runtime.block_on(async {
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
            let (server, _) = start_measured(n).await;
            let list = Target::get(&server, "/v1/admin/models");
            let healthz = Target::get(&server, "/healthz");
            rows.push(row(format!("GET /v1/admin/models, {n} models"), &list, &healthz, 1).await);
        }

        eprintln!("server with no models:");
        let (server, empty) = start_measured(0).await;
        drop(server);
        eprintln!("server with {MANY} stub models:");
        let (server, many) = start_measured(MANY).await;
        let memory = Memory { empty, many };
        let healthz = Target::get(&server, "/healthz");
        let one = format!("/v1/admin/models/{}", model_name(MANY / 2));
        let targets = [
            Target::get(&server, "/v1/admin/models"),
            Target::get(&server, "/v1/admin/models?state=loaded"),
            Target::get(&server, "/v1/admin/models?type=llm"),
            Target::get(&server, &one),
            Target::post(&server, "/v2/repository/index", json!({})),
            Target::get(&server, "/api/v1/health"),
            Target::get(&server, "/metrics"),
            Target::get(&server, "/metrics/node"),
        ];
        for target in &targets {
            let label = format!("{} {}, {MANY} models", target.method(), target.path(&server));
            rows.push(row(label, target, &healthz, 1).await);
        }
        (rows, memory)
    });
    print_table(&rows);
    print_goals(&rows, &memory);
}

/// The figures that have a goal, each next to it.
fn print_goals(rows: &[Row], memory: &Memory) {
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    let list = format!("GET /v1/admin/models, {MANY} models");
    if let Some(r) = rows.iter().find(|r| r.measure == list) {
        let p50 = r.hangar.percentile_us(0.5);
        println!(
            "goal: {list} p50 ≤ {:.0} ms: {:.2} ms ({})",
            LIST_P50_GOAL_US / 1000.0,
            p50 / 1000.0,
            verdict(p50 <= LIST_P50_GOAL_US)
        );
    }
    let node = format!("GET /metrics/node, {MANY} models");
    if let Some(r) = rows.iter().find(|r| r.measure == node) {
        let cost = r.hangar.percentile_us(0.5) - r.reference.percentile_us(0.5);
        println!(
            "goal: {node} p50 over GET /healthz ≤ {:.0} ms: {:.3} ms ({})",
            NODE_SCRAPE_GOAL_US / 1000.0,
            cost / 1000.0,
            verdict(cost <= NODE_SCRAPE_GOAL_US)
        );
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let (start_up, after_lists) = memory.per_model_kib();
    println!(
        "resident memory (VmRSS): no models {:.1} MiB after start-up, {:.1} MiB after {LISTS} \
         full lists; {MANY} models {:.1} MiB, {:.1} MiB",
        mib(memory.empty.start_up_kib),
        mib(memory.empty.after_lists_kib),
        mib(memory.many.start_up_kib),
        mib(memory.many.after_lists_kib),
    );
    println!(
        "goal: RSS ≤ {RSS_START_UP_GOAL_KIB:.0} KiB per configured model after start-up: \
         {start_up:.2} KiB ({})",
        verdict(start_up <= RSS_START_UP_GOAL_KIB)
    );
    println!(
        "goal: RSS ≤ {RSS_AFTER_LISTS_GOAL_KIB:.0} KiB per configured model after {LISTS} full \
         lists: {after_lists:.2} KiB ({})",
        verdict(after_lists <= RSS_AFTER_LISTS_GOAL_KIB)
    );
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
