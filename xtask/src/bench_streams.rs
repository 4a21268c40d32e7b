//! The concurrency section of `cargo xtask bench llamacpp`: 1, 4 and 8 concurrent streams
//! on Hangar's in-process llama.cpp engine and on llama.cpp's `llama-server`.
//!
//! The single-stream table pins both servers to one thread so the two engines' per-token
//! cost can be compared. Here both servers run on their **defaults** against each other, as
//! a user would start them: no `gguf_n_threads` in Hangar's config, no `-t`/`-tb` for
//! `llama-server`, and `llama-server`'s prompt cache left on. Each row asks what a server
//! makes of N clients out of the box.
//!
//! Every sequence gets the same context, [`N_CTX`]:
//! - **hangar batch**: one model entry with `replicas: 1`, `target_inflight: N` and
//!   `gguf_n_ctx: N_CTX`; the engine serves the N sequences in one context (continuous
//!   batching), each with `N_CTX` tokens;
//! - **hangar replicas**: `replicas: N`, `target_inflight: 1`: N engines of one sequence
//!   each (no row for N = 1, where it is the batch row);
//! - **llama-server**: `-c N_CTX·N -np N`; it splits `-c` among its N slots, so each slot
//!   gets `N_CTX`. A new process per N.
//!
//! One `hangard` serves every Hangar row: its config has one disabled entry per (mode, N)
//! ([`entries`]) and `max_loaded_models.llm: 1`; each row loads its entry and unloads it
//! afterwards. Per row: a warm-up of N concurrent requests, then N client threads (each
//! with its own HTTP agent) that each send [`ROW_REQUESTS`]` / N` streaming chat
//! completions back to back, so every row makes the same number of requests whatever N is
//! and takes seconds rather than milliseconds. Each request's user message is distinct
//! ([`PROMPT`] plus its client and request number), so no server can answer from a cache of
//! an identical prompt; the shared prefix is what `llama-server`'s default prompt cache may
//! reuse, and that is part of its defaults.
//!
//! Measured per row: aggregate tokens/s (Σ completion tokens over the row's wall time, first
//! request sent → last finished), p50 and p99 request latency, median time to first token,
//! and the server's resident memory (`VmRSS`) right after the row. For `hangard` that is
//! the whole process with only the row's model loaded (plus whatever its allocator kept
//! from earlier rows).

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};

use crate::bench_llamacpp::{
    Bench, MAX_TOKENS, MODEL, N_CTX, PROMPT, Server, Streamed, chat_body, client, complete,
    cpu_model, median, ms, stream_with,
};

/// Concurrent streams per row.
const STREAM_COUNTS: [usize; 3] = [1, 4, 8];
/// Streaming requests per row on the tiny fixture, split evenly among its N clients (K =
/// `ROW_REQUESTS / N` each): 768 × [`MAX_TOKENS`] ≈ 98,000 tokens, about 10–20 s at
/// 5,000–10,000 tokens/s.
pub(crate) const ROW_REQUESTS: usize = 768;
/// Streaming requests per row on the trained model: 32 × [`MAX_TOKENS`] ≈ 4,100 tokens,
/// about 40–80 s at its 50–100 tokens/s on two cores.
pub(crate) const ROW_REQUESTS_TRAINED: usize = 32;

/// Runs every row and prints the second table; both servers are killed on return.
pub(crate) fn run(bench: &Bench) -> Result<()> {
    let config = write_config(bench)?;
    let log = bench.work.join("hangard-streams.log");
    let (child, base) = crate::e2e::spawn_serve(&bench.hangard, &config, &[], &bench.work, &log)?;
    let hangar = Server::new("hangar", child, base, log);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for n in STREAM_COUNTS {
        for entry in entries(n) {
            eprintln!("streams: {n} on hangar {}", entry.name);
            admin(&hangar, &format!("/v1/admin/models/{}/load", entry.name))?;
            if let Some(details) = runtime_details(&hangar, &entry.name)? {
                notes.push(format!("hangar {}: runtime_details {details}", entry.name));
            }
            rows.push(measure(&hangar, &entry.name, n, entry.mode, bench.row_requests)?);
            admin(&hangar, &format!("/v1/admin/models/{}/unload", entry.name))?;
        }
        eprintln!("streams: {n} on llama-server");
        let (ctx, slots) = ((N_CTX as usize * n).to_string(), n.to_string());
        let args = ["-c", &ctx, "-np", &slots, "--no-webui"];
        let llama = bench.spawn_llama_server(&args, &format!("llama-server-streams-{n}.log"))?;
        if let Some(threads) = llama_threads(&llama) {
            notes.push(format!("llama-server -np {n}: {threads}"));
        }
        rows.push(measure(&llama, MODEL, n, "llama-server", bench.row_requests)?);
    }
    drop(hangar);
    print_table(bench, &rows, &notes);
    Ok(())
}

/// One Hangar model entry of the config: how one row serves its N streams.
struct Entry {
    /// The entry's name, e.g. `batch-4`.
    name: String,
    /// The table's label: `hangar batch` or `hangar replicas`.
    mode: &'static str,
    /// `replicas` (and `replica_max`).
    replicas: usize,
    /// `target_inflight`: sequences per replica.
    target_inflight: usize,
}

/// The Hangar entries for `n` streams: batch, and replicas when `n` > 1.
fn entries(n: usize) -> Vec<Entry> {
    let batch =
        Entry { name: format!("batch-{n}"), mode: "hangar batch", replicas: 1, target_inflight: n };
    let replicas = Entry {
        name: format!("replicas-{n}"),
        mode: "hangar replicas",
        replicas: n,
        target_inflight: 1,
    };
    if n > 1 { vec![batch, replicas] } else { vec![batch] }
}

/// The config directory of the concurrency rows: every [`entries`] entry, disabled, CPU
/// only, engine defaults otherwise (no thread count); one LLM loaded at a time.
fn write_config(bench: &Bench) -> Result<std::path::PathBuf> {
    let mut models = Map::new();
    for entry in STREAM_COUNTS.into_iter().flat_map(entries) {
        let model = json!({
            "backend": "llama_cpp",
            "enabled": false,
            "model_path": bench.model,
            "prompt_format": "auto",
            "gguf_n_ctx": N_CTX,
            "gguf_n_gpu_layers": 0,
            "replicas": entry.replicas,
            "replica_max": entry.replicas.max(entry.target_inflight),
            "target_inflight": entry.target_inflight,
        });
        models.insert(entry.name, model);
    }
    let settings = json!({
        "host": "127.0.0.1",
        "auto_load": false,
        "max_loaded_models": {"llm": 1},
        "models": models,
    });
    crate::bench_llamacpp::write_settings(&bench.work, "streams-config", &settings)
}

/// `POST path` (a load or unload) without a body; anything but 200 is an error.
pub(crate) fn admin(server: &Server, path: &str) -> Result<()> {
    let mut response = server.agent.post(server.url(path)).send_empty()?;
    let body = response.body_mut().read_to_string()?;
    let status = response.status();
    if status != 200 {
        bail!("POST {path} answered {status}: {body}; see {}", server.log.display());
    }
    Ok(())
}

/// The `runtime_details` field of `GET /v1/admin/models/{name}`, verbatim, when the row
/// has one (the engine's effective settings, e.g. its thread counts).
fn runtime_details(server: &Server, name: &str) -> Result<Option<String>> {
    let path = format!("/v1/admin/models/{name}");
    let mut response = server.agent.get(server.url(&path)).call()?;
    let body = response.body_mut().read_to_string()?;
    let status = response.status();
    if status != 200 {
        bail!("GET {path} answered {status}: {body}; see {}", server.log.display());
    }
    let row: Value =
        serde_json::from_str(&body).with_context(|| format!("GET {path} is not JSON: {body}"))?;
    Ok(row.get("runtime_details").map(Value::to_string))
}

/// The thread counts `llama-server` logs at start (`system_info: n_threads = …`), if any.
fn llama_threads(server: &Server) -> Option<String> {
    let log = std::fs::read_to_string(&server.log).ok()?;
    let line = log.lines().find_map(|l| l.split_once("system_info: "))?.1;
    Some(line.split(" | ").next().unwrap_or(line).trim().to_owned())
}

/// A chat request (streaming with usage when `stream`) to `model` with the user message [`PROMPT`]` (tag)`.
fn chat(model: &str, tag: &str, stream: bool) -> Value {
    chat_body(model, &format!("{PROMPT} ({tag})"), stream)
}

/// One line of the second table.
struct Row {
    /// Concurrent streams (N).
    streams: usize,
    /// `hangar batch`, `hangar replicas` or `llama-server`.
    mode: &'static str,
    /// Σ completion tokens / the row's wall time.
    tokens_per_second: f64,
    /// Median request latency.
    p50: Duration,
    /// 99th percentile request latency (nearest rank).
    p99: Duration,
    /// Median time to first token.
    ttft: Duration,
    /// The server's `VmRSS` after the row, MiB.
    rss_mib: f64,
}

/// What one client thread did.
struct ClientRun {
    /// Just before its first request.
    start: Instant,
    /// Just after its last request ended.
    end: Instant,
    /// Each of its requests.
    requests: Vec<Streamed>,
}

/// A warm-up of `n` concurrent requests, then the timed row of `n` clients on `server`.
fn measure(
    server: &Server,
    model: &str,
    n: usize,
    mode: &'static str,
    requests: usize,
) -> Result<Row> {
    std::thread::scope(|s| {
        let warm: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || complete(server, &chat(model, &format!("warm-up {i}"), false)))
            })
            .collect();
        warm.into_iter().try_for_each(|h| joined(h.join()).map(drop))
    })
    .with_context(|| format!("{mode}, {n} streams: warm-up; see {}", server.log.display()))?;

    let per_client = requests / n;
    let barrier = Barrier::new(n);
    let failed = AtomicBool::new(false);
    let runs = std::thread::scope(|s| {
        let clients: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, failed) = (&barrier, &failed);
                s.spawn(move || client_run(server, model, i, per_client, barrier, failed))
            })
            .collect();
        clients.into_iter().map(|h| joined(h.join())).collect::<Result<Vec<_>>>()
    })
    .with_context(|| format!("{mode}, {n} streams; see {}", server.log.display()))?;

    let start = runs.iter().map(|r| r.start).min().context("no client ran")?;
    let end = runs.iter().map(|r| r.end).max().context("no client ran")?;
    let requests: Vec<_> = runs.into_iter().flat_map(|r| r.requests).collect();
    let tokens: u64 = requests.iter().map(|r| u64::from(r.completion_tokens)).sum();
    let mut latency: Vec<_> = requests.iter().map(|r| r.elapsed).collect();
    let mut ttft: Vec<_> = requests.iter().map(|r| r.first).collect();
    let row = Row {
        streams: n,
        mode,
        tokens_per_second: tokens as f64 / (end - start).as_secs_f64(),
        p50: median(&mut latency),
        p99: percentile(&mut latency, 0.99),
        ttft: median(&mut ttft),
        rss_mib: rss_mib(server)?,
    };
    eprintln!(
        "  {} requests, {tokens} tokens in {:.1} s: {:.0} tokens/s",
        requests.len(),
        (end - start).as_secs_f64(),
        row.tokens_per_second
    );
    Ok(row)
}

/// One client thread: its own agent, then `count` streams back to back once all clients
/// are ready. Stops early (the row fails anyway) when another client has failed.
fn client_run(
    server: &Server,
    model: &str,
    client_index: usize,
    count: usize,
    barrier: &Barrier,
    failed: &AtomicBool,
) -> Result<ClientRun> {
    let agent = client();
    let mut requests = Vec::with_capacity(count);
    barrier.wait();
    let start = Instant::now();
    for j in 0..count {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        let body = chat(model, &format!("client {client_index}, request {j}"), true);
        match stream_with(&agent, server, &body) {
            Ok(done) => requests.push(done),
            Err(e) => {
                failed.store(true, Ordering::Relaxed);
                return Err(e.context(format!("client {client_index}, request {j}")));
            }
        }
    }
    Ok(ClientRun { start, end: Instant::now(), requests })
}

/// A joined thread's result; a panic becomes an error.
fn joined<T>(result: std::thread::Result<Result<T>>) -> Result<T> {
    result.map_err(|_| anyhow!("a client thread panicked"))?
}

/// The nearest-rank `q` quantile (0 < `q` ≤ 1) of `samples`.
fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let rank = (q * samples.len() as f64).ceil() as usize;
    samples.get(rank.saturating_sub(1)).copied().unwrap_or_default()
}

/// `VmRSS` of the server process from `/proc/<pid>/status`, in MiB.
fn rss_mib(server: &Server) -> Result<f64> {
    let path = format!("/proc/{}/status", server.child.id());
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no VmRSS in {path}"))?;
    Ok(kib as f64 / 1024.0)
}

/// The second table (stdout): each row next to `llama-server` at the same N, then `notes`
/// (the engines' reported settings).
fn print_table(bench: &Bench, rows: &[Row], notes: &[String]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "Concurrent streams: {} on {cores} cores ({}), CPU only, both servers on their \
         default threads; context {N_CTX} per sequence; {} streaming chat \
         completions per row (split among the streams), each with its own message, \
         temperature 0, max_tokens {MAX_TOKENS}",
        crate::bench_llamacpp::model_name(&bench.model),
        cpu_model(),
        bench.row_requests
    );
    println!(
        "hangar batch: replicas 1, target_inflight N; hangar replicas: replicas N, \
         target_inflight 1; llama-server: -c {N_CTX}·N -np N, prompt cache on (its default)"
    );
    println!();
    println!(
        "| streams | server/mode | tokens/s | ratio vs llama-server | p50 ms | p99 ms | \
         TTFT p50 ms | RSS MiB |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let llama = rows.iter().find(|l| l.streams == r.streams && l.mode == "llama-server");
        let ratio = llama.map_or(f64::NAN, |l| r.tokens_per_second / l.tokens_per_second);
        println!(
            "| {} | {} | {:.0} | {ratio:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.streams,
            r.mode,
            r.tokens_per_second,
            ms(r.p50),
            ms(r.p99),
            ms(r.ttft),
            r.rss_mib
        );
    }
    println!();
    println!(
        "RSS: VmRSS after the row; hangard's is the whole process with only that row's model \
         loaded."
    );
    for note in notes {
        println!("{note}");
    }
}
