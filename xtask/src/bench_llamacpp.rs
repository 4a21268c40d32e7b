//! `cargo xtask bench llamacpp`: Hangar's in-process llama.cpp engine against llama.cpp's
//! own `llama-server`, on the same GGUF file, in one run.
//!
//! 1. `llama-server` comes from [`crate::llama_server`] (what `cargo xtask llama-server`
//!    builds): llama.cpp as vendored in the `llama-cpp-python` sdist, with the CPU flags
//!    `llama-cpp-sys-2` gives Hangar's own llama.cpp and statically linked like it, cached
//!    in `target/llama-server`; a second run builds nothing.
//! 2. `hangard` is built in release and started on a config of one `llama_cpp` model (the
//!    trained SmolLM2-135M-Instruct Q4_1 GGUF of `cargo xtask fixtures`, or with `--tiny` the
//!    random fixture [`FIXTURE`]; CPU only, `auto_load: false`); `llama-server` is started on the
//!    same file with the same context size and threads, one slot and no prompt cache. Hangar's
//!    slot reuses the prefix it holds, so on these identical requests it skips the prompt and
//!    `llama-server` decodes it again: the time-to-first-token row measures that prefill, not
//!    the servers (`docs/benchmarks.md`; the concurrency table runs both on their defaults).
//! 3. Load time, [`LOAD_ROUNDS`] times each: Hangar's `POST /v1/admin/models/{name}/load`
//!    wall time, and for both servers process spawn → model ready (Hangar: its listening
//!    line, then the load; `llama-server`: `GET /health` answers 200).
//! 4. After a warm-up, [`REQUESTS`] non-streaming and [`STREAMS`] streaming chat completions
//!    per server with one fixed prompt, temperature 0 and `max_tokens` [`MAX_TOKENS`], in
//!    interleaved blocks (so load elsewhere on the host hits both alike): tokens/s from
//!    `usage.completion_tokens` over client-side wall time (Σ tokens / Σ time, and the
//!    median request, which a single stalled request cannot move), and time to first token.
//!    Both servers run [`THREADS`] generation thread(s).
//! 5. A table of both and their ratio (hangar / llama-server). Both servers are killed at the
//!    end, on errors too.
//! 6. The concurrency section ([`crate::bench_streams`]): 1, 4 and 8 concurrent streams on
//!    both servers' defaults, in a second table.
//! 7. The prefill section ([`crate::bench_prefill`]): a prompt of over 2,000 tokens on both
//!    servers' defaults, in a third table.
//!
//! The HTTP client is `ureq` (blocking), configured the same for both servers: a fresh
//! connection per request (no pooled keep-alive connection that a server may close under
//! us), streamed bodies read line by line as they arrive.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::llama_server::LCP_VERSION;
use crate::{cargo, deps, llama_server, run as run_checked};

mod client;

pub(crate) use client::{Server, Streamed, client, complete, stream_with, write_settings};
use client::{stream, write_config};

/// The model both servers load, relative to the workspace root.
pub(crate) const FIXTURE: &str = "fixtures/models/tiny-llama.gguf";
/// The model's name in Hangar's config.
pub(crate) const MODEL: &str = "model";
/// Context size on both servers (the fixture's training context).
pub(crate) const N_CTX: u32 = 2048;
/// CPU threads for generation and prompt processing on both servers. One: the fixture's
/// matrices are 64 wide, so a token costs microseconds of arithmetic and a second thread
/// only adds synchronization; on a shared 2-core machine two OpenMP threads per server also
/// stall whenever something else holds a core, which makes the figures unreadable.
const THREADS: usize = 1;
/// The user message of every chat request.
pub(crate) const PROMPT: &str = "Write a long story about a hangar full of aeroplanes.";
/// Tokens per completion.
pub(crate) const MAX_TOKENS: u32 = 128;
/// Timed non-streaming requests per server.
const REQUESTS: usize = 40;
/// Timed streaming requests per server.
const STREAMS: usize = 20;
/// Interleaved blocks the timed requests are split into (hangar, llama-server, hangar, …).
const BLOCKS: usize = 4;
/// Process starts (and loads) measured per server.
const LOAD_ROUNDS: usize = 5;
/// How long a server may take to become ready.
pub(crate) const READY_LIMIT: Duration = Duration::from_secs(120);
/// How long one read of an HTTP answer may stall.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting may take (loopback: refused at once while a server starts).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What every bench against `llama-server` starts from.
pub(crate) struct Setup {
    /// The release `hangard`, freshly built.
    pub(crate) hangard: PathBuf,
    /// The cached `llama-server` ([`llama_server::ensure`]).
    pub(crate) llama_server: PathBuf,
    /// [`FIXTURE`], canonical.
    pub(crate) model: PathBuf,
    /// `target/bench/<name>`, created.
    pub(crate) work: PathBuf,
}

/// Installs what the builds need, builds `llama-server` (cached) and the release
/// `hangard`, and creates the bench's work directory `target/bench/<name>`.
pub(crate) fn setup(root: &Path, name: &str) -> Result<Setup> {
    let target = crate::target_dir(root)?;
    deps::ensure()?;
    let llama_server = llama_server::ensure(root)?;
    let mut build = cargo(root);
    build.args(["build", "--release", "--locked", "-p", "hangard"]);
    run_checked(build)?;
    let hangard = target.join("release").join("hangard");
    let work = target.join("bench").join(name);
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let model = root.join(FIXTURE);
    let model = model.canonicalize().with_context(|| format!("cannot find {}", model.display()))?;
    Ok(Setup { hangard, llama_server, model, work })
}

/// Builds both servers (when needed), measures, prints the table: on the trained
/// SmolLM2-135M-Instruct GGUF (`cargo xtask fixtures`), or with `tiny` on the tiny random
/// fixture [`FIXTURE`], whose tokens cost microseconds (the control-plane worst case).
pub(crate) fn run(root: &Path, tiny: bool) -> Result<()> {
    let Setup { hangard, llama_server, mut model, work } = setup(root, "llamacpp")?;
    if !tiny {
        model = crate::trained::ensure(root)?.join(crate::trained::CHAT_FILE);
    }
    let config = write_config(&work, &model)?;
    let row_requests = if tiny {
        crate::bench_streams::ROW_REQUESTS
    } else {
        crate::bench_streams::ROW_REQUESTS_TRAINED
    };
    let bench = Bench { hangard, llama_server, model, config, work, row_requests };

    eprintln!("load: {LOAD_ROUNDS} process starts per server");
    let mut hangar_load = Vec::new();
    let mut hangar_ready = Vec::new();
    let mut llama_ready = Vec::new();
    let mut servers = None;
    for round in 0..LOAD_ROUNDS {
        drop(servers.take());
        let (hangar, llama) = if round % 2 == 0 {
            let hangar = bench.start_hangar()?;
            (hangar, bench.start_llama_server()?)
        } else {
            let llama = bench.start_llama_server()?;
            (bench.start_hangar()?, llama)
        };
        eprintln!(
            "  round {}: hangar load {:.1} ms, spawn → ready {:.1} ms; llama-server spawn → \
             ready {:.1} ms",
            round + 1,
            ms(hangar.load),
            ms(hangar.ready),
            ms(llama.ready)
        );
        hangar_load.push(hangar.load);
        hangar_ready.push(hangar.ready);
        llama_ready.push(llama.ready);
        servers = Some((hangar, llama));
    }
    let (hangar, llama) = servers.context("no load round ran")?;

    let chat = |stream: bool| chat_body(MODEL, PROMPT, stream);
    eprintln!("warm-up");
    let mut first = Vec::new();
    for server in [&hangar, &llama] {
        first.push(complete(server, &chat(false))?);
        complete(server, &chat(false))?;
        stream(server, &chat(true))?;
    }
    let (h, l) = (&first[0], &first[1]);
    eprintln!(
        "  hangar: {} prompt + {} completion tokens ({}); llama-server: {} + {} ({}); text: {}",
        h.prompt_tokens,
        h.completion_tokens,
        h.finish_reason,
        l.prompt_tokens,
        l.completion_tokens,
        l.finish_reason,
        compare_text(&h.text, &l.text)
    );
    if h.completion_tokens != l.completion_tokens {
        eprintln!(
            "  warning: the servers generate different numbers of tokens; tokens/s still \
             divides each server's own count by its own time"
        );
    }

    eprintln!("generation: {REQUESTS} requests and {STREAMS} streams per server");
    let mut totals = [Totals::default(), Totals::default()];
    for block in 0..BLOCKS {
        let order = if block % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let server = [&hangar, &llama][i];
            let totals = &mut totals[i];
            for _ in 0..share(REQUESTS, block) {
                let done = complete(server, &chat(false))?;
                totals.tokens += u64::from(done.completion_tokens);
                totals.counts.push(done.completion_tokens);
                totals.time += done.elapsed;
                totals.rates.push(rate(done.completion_tokens, done.elapsed));
                totals.server_ms += done.server_predicted_ms;
            }
            for _ in 0..share(STREAMS, block) {
                let done = stream(server, &chat(true))?;
                totals.stream_tokens += u64::from(done.completion_tokens);
                totals.counts.push(done.completion_tokens);
                totals.stream_time += done.elapsed;
                totals.stream_rates.push(rate(done.completion_tokens, done.elapsed));
                totals.ttft.push(done.first);
            }
        }
    }
    drop(hangar);
    drop(llama);

    let rows = [
        Row::new(
            format!(
                "load ms, median of {LOAD_ROUNDS} (hangar: POST …/load; llama-server: spawn → \
                 /health 200)"
            ),
            ms(median(&mut hangar_load)),
            ms(median(&mut llama_ready.clone())),
        ),
        Row::new(
            format!("spawn → model ready ms, median of {LOAD_ROUNDS} (both incl. process start)"),
            ms(median(&mut hangar_ready)),
            ms(median(&mut llama_ready)),
        ),
        Row::new(
            format!("tokens/s, Σ of {REQUESTS} non-streaming requests (higher is better)"),
            totals[0].tokens_per_second(),
            totals[1].tokens_per_second(),
        ),
        Row::new(
            format!("tokens/s, median of {REQUESTS} non-streaming requests (higher is better)"),
            median_f64(&mut totals[0].rates),
            median_f64(&mut totals[1].rates),
        ),
        Row::new(
            format!("tokens/s, Σ of {STREAMS} streams (higher is better)"),
            totals[0].stream_tokens_per_second(),
            totals[1].stream_tokens_per_second(),
        ),
        Row::new(
            format!("tokens/s, median of {STREAMS} streams (higher is better)"),
            median_f64(&mut totals[0].stream_rates),
            median_f64(&mut totals[1].stream_rates),
        ),
        Row::new(
            format!("time to first token ms, median of {STREAMS} streams"),
            ms(median(&mut totals[0].ttft)),
            ms(median(&mut totals[1].ttft)),
        ),
    ];
    print_table(root, &bench, &rows, &totals);
    crate::bench_streams::run(&bench)?;
    crate::bench_prefill::run(&bench)
}

/// A greedy chat request to `model` with the user message `content`, `max_tokens`
/// [`MAX_TOKENS`]; streaming with usage when `stream`.
pub(crate) fn chat_body(model: &str, content: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Paths and settings shared by every server start.
pub(crate) struct Bench {
    /// The release `hangard` binary.
    pub(crate) hangard: PathBuf,
    /// The cached `llama-server` binary.
    pub(crate) llama_server: PathBuf,
    /// The GGUF both servers load (canonical).
    pub(crate) model: PathBuf,
    /// The config directory of the single-stream rows.
    config: PathBuf,
    /// Streaming requests per row of the concurrency table.
    pub(crate) row_requests: usize,
    /// `target/bench/llamacpp`: configs and server logs.
    pub(crate) work: PathBuf,
}

impl Bench {
    /// The bench of another benchmark (`bench swap`): its binaries, model, config and work
    /// directory.
    pub(crate) fn new(
        hangard: PathBuf,
        llama_server: PathBuf,
        model: PathBuf,
        config: PathBuf,
        work: PathBuf,
    ) -> Self {
        let row_requests = crate::bench_streams::ROW_REQUESTS_TRAINED;
        Self { hangard, llama_server, model, config, work, row_requests }
    }

    /// `hangard serve` on the bench config, nothing loaded.
    pub(crate) fn start_hangard(&self) -> Result<Server> {
        let log_path = self.work.join("hangard.log");
        let (child, base) =
            crate::e2e::spawn_serve(&self.hangard, &self.config, &[], &self.work, &log_path)?;
        Ok(Server::new("hangar", child, base, log_path))
    }

    /// `hangard serve` on the bench config, then the load of the model; times both.
    fn start_hangar(&self) -> Result<Server> {
        let log_path = self.work.join("hangard.log");
        let spawned = Instant::now();
        let (child, base) =
            crate::e2e::spawn_serve(&self.hangard, &self.config, &[], &self.work, &log_path)?;
        let mut server = Server::new("hangar", child, base, log_path);
        let path = format!("/v1/admin/models/{MODEL}/load");
        let started = Instant::now();
        let mut response = server.agent.post(server.url(&path)).send_json(json!({}))?;
        let body = response.body_mut().read_to_string()?;
        server.load = started.elapsed();
        server.ready = spawned.elapsed();
        let status = response.status();
        if status != 200 {
            bail!("POST {path} answered {status}: {body}; see {}", server.log.display());
        }
        Ok(server)
    }

    /// `llama-server` on the same model, context and threads; ready when `/health` is 200.
    fn start_llama_server(&self) -> Result<Server> {
        let threads = THREADS.to_string();
        let args = ["-c", &N_CTX.to_string(), "-t", &threads, "-tb", &threads];
        let args = [&args[..], &["-np", "1", "--no-cache-prompt", "--no-webui"]].concat();
        self.spawn_llama_server(&args, "llama-server.log")
    }

    /// `llama-server -m <model> <args> --host 127.0.0.1 --port <free port>`, its output in
    /// `<work>/<log_name>`; ready (and timed) when `/health` answers 200.
    pub(crate) fn spawn_llama_server(&self, args: &[&str], log_name: &str) -> Result<Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log_path = self.work.join(log_name);
        let log = File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let spawned = Instant::now();
        let child = Command::new(&self.llama_server)
            .arg("-m")
            .arg(&self.model)
            .args(args)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", self.llama_server.display()))?;
        let base = format!("http://127.0.0.1:{port}");
        let mut server = Server::new("llama-server", child, base, log_path);
        let deadline = spawned + READY_LIMIT;
        let health = server.url("/health");
        loop {
            // Refused until it listens, 503 while it loads.
            if let Ok(mut response) = server.agent.get(&health).call() {
                let _ = response.body_mut().read_to_vec();
                if response.status() == 200 {
                    break;
                }
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("llama-server exited ({status}); see {}", server.log.display());
            }
            if Instant::now() >= deadline {
                bail!("llama-server not ready after {READY_LIMIT:?}; see {}", server.log.display());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        server.ready = spawned.elapsed();
        Ok(server)
    }
}

/// What one server did in the timed requests.
#[derive(Default)]
struct Totals {
    tokens: u64,
    time: Duration,
    stream_tokens: u64,
    stream_time: Duration,
    ttft: Vec<Duration>,
    /// Tokens/s of each non-streaming request.
    rates: Vec<f64>,
    /// Tokens/s of each stream.
    stream_rates: Vec<f64>,
    /// `completion_tokens` of every timed request.
    counts: Vec<u32>,
    /// Sum of `llama-server`'s own `timings.predicted_ms`.
    server_ms: f64,
}

impl Totals {
    /// Σ tokens / Σ wall time of the non-streaming requests.
    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.time.as_secs_f64()
    }

    /// Σ tokens / Σ wall time of the streams.
    fn stream_tokens_per_second(&self) -> f64 {
        self.stream_tokens as f64 / self.stream_time.as_secs_f64()
    }

    /// The distinct completion lengths, e.g. `128` or `97–128`.
    fn count_range(&self) -> String {
        let min = self.counts.iter().min().copied().unwrap_or(0);
        let max = self.counts.iter().max().copied().unwrap_or(0);
        if min == max { min.to_string() } else { format!("{min}–{max}") }
    }
}

/// One line of the table; its ratio is hangar / llama-server.
struct Row {
    measure: String,
    hangar: f64,
    llama: f64,
}

impl Row {
    /// A row of the table.
    fn new(measure: impl Into<String>, hangar: f64, llama: f64) -> Self {
        Self { measure: measure.into(), hangar, llama }
    }
}

/// The GGUF's file name, for the tables.
pub(crate) fn model_name(model: &Path) -> String {
    model.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The table (stdout), with the machine, the binaries and the completion lengths.
fn print_table(root: &Path, bench: &Bench, rows: &[Row], totals: &[Totals; 2]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "{} on {cores} cores ({}); context {N_CTX}, {THREADS} thread(s), CPU only; \
         chat completions with temperature 0 and max_tokens {MAX_TOKENS}",
        model_name(&bench.model),
        cpu_model()
    );
    println!(
        "hangar: {} (llama-cpp-sys-2 {})",
        bench.hangard.display(),
        locked_version(root, "llama-cpp-sys-2")
    );
    println!(
        "llama-server: {} (llama-cpp-python {LCP_VERSION} sdist; {})",
        bench.llama_server.display(),
        server_version(&bench.llama_server)
    );
    println!();
    println!("| measure | hangar | llama-server | ratio |");
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.2} |",
            r.measure,
            r.hangar,
            r.llama,
            r.hangar / r.llama
        );
    }
    println!();
    println!(
        "completion tokens per request: hangar {}, llama-server {}",
        totals[0].count_range(),
        totals[1].count_range()
    );
    if totals[1].server_ms > 0.0 {
        println!(
            "llama-server's own timings (generation only, no HTTP): {:.1} tokens/s",
            totals[1].tokens as f64 / (totals[1].server_ms / 1000.0)
        );
    }
}

/// Whether two completions' texts agree, and if not, for how many characters.
fn compare_text(hangar: &str, llama: &str) -> String {
    if hangar == llama {
        return format!("identical ({} characters)", hangar.chars().count());
    }
    let common = hangar.chars().zip(llama.chars()).take_while(|(a, b)| a == b).count();
    format!(
        "the first {common} characters agree (hangar {}, llama-server {} in all)",
        hangar.chars().count(),
        llama.chars().count()
    )
}

/// The version of `package` in `Cargo.lock`.
fn locked_version(root: &Path, package: &str) -> String {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    let name = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    lines
        .find(|l| *l == name)
        .and_then(|_| lines.next())
        .and_then(|l| l.strip_prefix("version = \""))
        .map_or_else(|| "?".to_owned(), |v| v.trim_end_matches('"').to_owned())
}

/// The `version: …` line of `llama-server --version` (build number and commit).
fn server_version(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            text.lines().find(|l| l.starts_with("version:")).map(str::to_owned)
        })
        .unwrap_or_else(|| "version unknown".to_owned())
}

/// The CPU's model name from `/proc/cpuinfo`.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

/// How many of `total` requests run in interleaved block `block`.
fn share(total: usize, block: usize) -> usize {
    total / BLOCKS + usize::from(block < total % BLOCKS)
}

/// The middle sample (the upper one of an even count).
pub(crate) fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// [`median`] of rates.
fn median_f64(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Tokens per second of one request.
fn rate(tokens: u32, elapsed: Duration) -> f64 {
    f64::from(tokens) / elapsed.as_secs_f64()
}

/// Milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
