//! `cargo xtask bench proxy`: what Hangar's `llama_server` backend adds on top of the
//! `llama-server` it starts, next to nginx as a reference reverse proxy, and what its model
//! swap costs next to doing the same by hand.
//!
//! 1. `hangard` (release) runs a config of one `llama_server` model ([`MODEL`], the fixture
//!    [`FIXTURE`], `llama_server_n_ctx` [`N_CTX`], `--no-webui`, everything else on its
//!    defaults; `--upstream-threads N` adds `--threads N`) and loads it: Hangar starts its
//!    own `llama-server` child. That child is the one upstream of every path: its address
//!    comes from `GET /v1/admin/models/{name}` → `runtime_details[0].backend_url`. nginx (Debian's
//!    package, installed with apt when missing and running as root) runs twice in the
//!    foreground with that child as its upstream, on generated configs in
//!    `target/bench/proxy/nginx-{defaults,tuned}` ([`nginx_conf`]): first as a user gets it
//!    (Debian's `worker_processes auto`, a bare `proxy_pass`: HTTP/1.0 and a new upstream
//!    connection per request, buffering on), then tuned for this job (one worker,
//!    `keepalive 32` upstream connections, HTTP/1.1 upstream, no buffering). Hangar runs on
//!    its defaults both times: defaults against defaults first, tuned second.
//! 2. Latency: after a warm-up, [`LATENCY_REQUESTS`] sequential non-streamed chat
//!    completions per path (direct, hangar, both nginx, round-robin, the order rotating every
//!    round, so drift and load elsewhere on the host hit all paths alike); p50 and p99 per
//!    path, and each proxy's added latency: the p50 and p99 of its same-round differences
//!    (proxy − direct), which drift cannot move. The goal compares Hangar with nginx on its
//!    defaults; the tuned nginx is reported next to it as a stricter reference.
//! 3. Throughput: [`CLIENTS`] client threads sending the same request back to back for
//!    [`THROUGHPUT_BLOCKS`] × [`THROUGHPUT_BLOCK`] per path (blocks in the order of the
//!    paths, then the reverse, and so on); completed requests over the blocks' wall
//!    time (start → the last request of the block answered), and their latencies. Hangar
//!    gives its child `--parallel` = `target_inflight` (default 1), hands it two requests
//!    more to queue (`dispatch_ahead`) and queues the rest in its own scheduler; direct and
//!    through nginx, they all queue in `llama-server`.
//! 4. Swap: a second `hangard` on a config of two `llama_server` models ([`SWAP_A`] with
//!    context [`N_CTX`], [`SWAP_B`] with [`N_CTX_B`]) and `max_loaded_models.llm: 1`: the
//!    wall time of `POST /v1/admin/models/B/load` while A is loaded (Hangar stops A, starts
//!    B, waits for its health route), then back, [`SWAP_ROUNDS`] times each way. The raw
//!    reference does the same by hand with the same two command lines (taken from each
//!    model's `runtime_details[0].command`, on a free port): SIGTERM to the running process,
//!    wait for its exit, spawn the other, poll `GET /health` every [`HEALTH_POLL`] until 200
//!    (a fresh connection per poll, none left open: see [`Bench::wait_health`]).
//!    Hangar's and the raw swaps alternate round by round. Both are split into phases (old
//!    engine exited, new engine spawned, ready): by hand from the clock, for Hangar from
//!    the millisecond timestamps of the exit and start lines in the models' logs
//!    (`GET /v1/admin/models/{name}/logs`).
//! 5. A table of every path's figures, and one of Hangar against its reference with the
//!    goal of each ratio.
//!
//! One HTTP client configuration serves every path ([`client`]): `ureq` with keep-alive
//! connections (a proxy benchmark should not measure connection set-up), idle connections
//! dropped after [`IDLE_AGE`] so none outlives `llama-server`'s 5 s keep-alive timeout.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::bench_llamacpp::{
    CONNECT_TIMEOUT, FIXTURE, IO_TIMEOUT, N_CTX, READY_LIMIT, Server, Setup, cpu_model, median, ms,
    setup,
};
use crate::run as run_checked;

/// The model of the latency and throughput parts.
const MODEL: &str = "tiny-llama";
/// The swap's first model: context [`N_CTX`].
const SWAP_A: &str = "swap-a";
/// The swap's second model: context [`N_CTX_B`].
const SWAP_B: &str = "swap-b";
/// [`SWAP_B`]'s context size.
const N_CTX_B: u32 = 4096;
/// The user message of every chat request.
const PROMPT: &str = "Say hello to the hangar.";
/// Tokens per completion: short, so the requests measure the path, not the model.
const MAX_TOKENS: u32 = 4;
/// Untimed requests per path before the latency part.
const WARM_UP: usize = 20;
/// Timed sequential requests per path.
const LATENCY_REQUESTS: usize = 2000;
/// Concurrent client threads of the throughput part.
const CLIENTS: usize = 8;
/// One throughput block of one path.
const THROUGHPUT_BLOCK: Duration = Duration::from_secs(3);
/// Throughput blocks per path (in the order of the paths, then the reverse, and so on).
const THROUGHPUT_BLOCKS: usize = 4;
/// Swaps timed each way, through Hangar and by hand.
const SWAP_ROUNDS: usize = 5;
/// The raw swap's pause between health polls.
const HEALTH_POLL: Duration = Duration::from_millis(1);
/// Goal: Hangar's added latency at most this times nginx's (p50 and p99).
const LATENCY_GOAL: f64 = 1.2;
/// Goal: Hangar's requests/s at least this share of direct's.
const THROUGHPUT_GOAL: f64 = 0.9;
/// Goal: Hangar's swap at most this times the raw swap.
const SWAP_GOAL: f64 = 1.05;
/// Below this, nginx's added latency is in the noise and the latency ratio means little.
const NOISE_US: f64 = 50.0;
/// Idle keep-alive connections older than this are not reused.
const IDLE_AGE: Duration = Duration::from_secs(2);
/// The Debian package that provides nginx.
const NGINX_PACKAGE: &str = "nginx";

/// Builds what is missing, measures, prints both tables.
/// `upstream_threads`: `--threads` of every `llama-server` the bench starts, when given.
pub(crate) fn run(root: &Path, upstream_threads: Option<u32>) -> Result<()> {
    let nginx = ensure_nginx()?;
    let Setup { hangard, llama_server, model, work } = setup(root, "proxy")?;
    // The probe: a fresh connection per request, none left open.
    let probe = crate::bench_llamacpp::client();
    let bench = Bench {
        hangard,
        llama_server,
        nginx,
        model,
        work,
        agent: client(),
        probe,
        upstream_threads,
    };

    let paths = bench.proxy_paths()?;
    let swap = bench.swaps()?;

    let versions = Versions {
        hangar: version_line(&bench.hangard, "--version"),
        llama_server: version_line(&bench.llama_server, "--version"),
        nginx: version_line(&bench.nginx, "-v"),
        commit: git_head(root),
    };
    print_tables(&bench, &versions, &paths, &swap);
    Ok(())
}

/// Binaries, files and the one HTTP client.
struct Bench {
    /// The release `hangard`.
    hangard: PathBuf,
    /// The cached `llama-server`.
    llama_server: PathBuf,
    /// nginx.
    nginx: PathBuf,
    /// The GGUF ([`FIXTURE`], canonical).
    model: PathBuf,
    /// `target/bench/proxy`: configs and logs.
    work: PathBuf,
    /// The client of every request of the bench (admin requests included).
    agent: ureq::Agent,
    /// The health polls of the by-hand swap and of nginx's start: the same client without
    /// keep-alive (see [`Bench::wait_health`]).
    probe: ureq::Agent,
    /// `--threads` of the engines, when set (`--upstream-threads`).
    upstream_threads: Option<u32>,
}

/// The ways to the upstream: direct, hangar, nginx on its defaults, nginx tuned.
const PATHS: usize = 4;

/// One way to the upstream `llama-server`.
struct Target {
    /// `direct`, `hangar`, `nginx (defaults)` or `nginx (tuned)`.
    name: &'static str,
    /// `http://127.0.0.1:PORT/v1/chat/completions`.
    chat_url: String,
}

/// What one path measured.
struct PathFigures {
    name: &'static str,
    /// Sequential request latencies.
    latency: Vec<Duration>,
    /// Latencies of the requests completed in the throughput blocks.
    loaded: Vec<Duration>,
    /// Wall time of the throughput blocks.
    wall: Duration,
}

impl PathFigures {
    fn requests_per_second(&self) -> f64 {
        self.loaded.len() as f64 / self.wall.as_secs_f64()
    }
}

/// The paths' figures and what describes their upstream.
struct Paths {
    /// direct, hangar, nginx (defaults), nginx (tuned).
    figures: [PathFigures; PATHS],
    /// The upstream's command line, as Hangar reports it.
    command: String,
    /// The upstream's thread setting, from its log.
    threads: Option<String>,
}

/// The swap times: `[A → B, B → A]` through Hangar and by hand.
struct Swaps {
    hangar: [Vec<Swap>; 2],
    raw: [Vec<Swap>; 2],
    command_a: String,
    command_b: String,
}

/// One swap.
struct Swap {
    /// When it began (Hangar's: to find its phases in the model logs).
    wall: Option<SystemTime>,
    /// Begin → the new engine is ready (Hangar: the load request answered).
    total: Duration,
    /// Begin → the old engine has exited.
    stopped: Option<Duration>,
    /// Begin → the new engine's process is spawned.
    spawned: Option<Duration>,
}

impl Swap {
    /// Finds the old engine's exit and the new engine's start in the logs (millisecond
    /// timestamps) within this swap's time span.
    fn place(&mut self, old: &[(i64, bool)], new: &[(i64, bool)]) {
        let Some(begin) = self.wall.and_then(|w| w.duration_since(UNIX_EPOCH).ok()) else {
            return;
        };
        let begin = (begin.as_millis() % DAY_MS as u128) as i64;
        let end = begin + self.total.as_millis() as i64 + 1;
        let within = |events: &[(i64, bool)], start: bool| {
            events
                .iter()
                .find(|(at, is_start)| *is_start == start && (begin - 1..=end).contains(at))
                .map(|(at, _)| Duration::from_millis((at - begin).max(0) as u64))
        };
        self.stopped = within(old, false);
        self.spawned = within(new, true);
    }
}

/// Milliseconds in a day.
const DAY_MS: i64 = 86_400_000;

/// Milliseconds of the UTC day of an RFC 3339 timestamp (`2026-11-23T00:54:53.433Z`).
fn day_ms(timestamp: &str) -> Option<i64> {
    let time = timestamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some((h * 3600 + m * 60) * 1000 + (s * 1000.0).round() as i64)
}

/// Versions of what ran.
struct Versions {
    hangar: String,
    llama_server: String,
    nginx: String,
    commit: String,
}

impl Bench {
    /// The engines' extra arguments: `--no-webui`, and `--threads` when set.
    fn extra_args(&self) -> Vec<String> {
        let mut args = vec!["--no-webui".to_owned()];
        if let Some(n) = self.upstream_threads {
            args.extend(["--threads".to_owned(), n.to_string()]);
        }
        args
    }

    /// Parts 1–3: one upstream, [`PATHS`] ways to it, latency and throughput of each.
    fn proxy_paths(&self) -> Result<Paths> {
        let config =
            self.write_config("config", &[(MODEL, N_CTX)], /* max_loaded_models */ None)?;
        let hangar = self.start_hangar(&config, "hangard.log")?;
        self.admin(&hangar, &format!("/v1/admin/models/{MODEL}/load"))?;
        let details = self.details(&hangar, MODEL)?;
        let backend_url = details
            .get("backend_url")
            .and_then(Value::as_str)
            .context("runtime_details[0] has no backend_url")?;
        let command = details.get("command").and_then(Value::as_str).unwrap_or("?").to_owned();
        let upstream = backend_url.strip_suffix("/v1").unwrap_or(backend_url).to_owned();
        let authority = upstream.strip_prefix("http://").context("backend_url is not http")?;
        eprintln!("upstream: Hangar's child at {upstream}: {command}");
        let mut plain = Nginx::start(&self.nginx, &self.work, authority, NginxSetup::Defaults)?;
        self.wait_health(&format!("{}/health", plain.base), || plain.exited())?;
        let mut tuned = Nginx::start(&self.nginx, &self.work, authority, NginxSetup::Tuned)?;
        self.wait_health(&format!("{}/health", tuned.base), || tuned.exited())?;
        let chat = |base: &str| format!("{base}/v1/chat/completions");
        let targets: [Target; PATHS] = [
            Target { name: "direct", chat_url: chat(&upstream) },
            Target { name: "hangar", chat_url: hangar.url("/v1/chat/completions") },
            Target { name: "nginx (defaults)", chat_url: chat(&plain.base) },
            Target { name: "nginx (tuned)", chat_url: chat(&tuned.base) },
        ];
        let body = chat_body();

        eprintln!("latency: {WARM_UP} warm-up + {LATENCY_REQUESTS} requests per path");
        for target in &targets {
            for _ in 0..WARM_UP {
                target.chat(&self.agent, &body)?;
            }
        }
        let mut latency: [Vec<Duration>; PATHS] = Default::default();
        for round in 0..LATENCY_REQUESTS {
            for k in 0..targets.len() {
                let i = (round + k) % targets.len();
                latency[i].push(targets[i].chat(&self.agent, &body)?);
            }
        }

        eprintln!(
            "throughput: {CLIENTS} clients, {THROUGHPUT_BLOCKS} × {} s per path",
            THROUGHPUT_BLOCK.as_secs()
        );
        let mut loaded: [Vec<Duration>; PATHS] = Default::default();
        let mut wall = [Duration::ZERO; PATHS];
        for block in 0..THROUGHPUT_BLOCKS {
            let mut order: [usize; PATHS] = std::array::from_fn(|i| i);
            if block % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (latencies, took) = throughput(&targets[i], &body)?;
                let n = latencies.len();
                eprintln!(
                    "  {}: {n} requests in {:.2} s ({:.0}/s), p50 {:.1} ms, max {:.1} ms",
                    targets[i].name,
                    took.as_secs_f64(),
                    n as f64 / took.as_secs_f64(),
                    ms(percentile(&latencies, 0.5)),
                    ms(percentile(&latencies, 1.0)),
                );
                loaded[i].extend(latencies);
                wall[i] += took;
            }
        }
        drop((plain, tuned));
        let threads = llama_threads(&hangar.log);
        self.admin(&hangar, &format!("/v1/admin/models/{MODEL}/unload"))?;
        drop(hangar);
        let mut latency = latency.into_iter();
        let mut loaded = loaded.into_iter();
        let figures = std::array::from_fn(|i| PathFigures {
            name: targets[i].name,
            latency: latency.next().unwrap_or_default(),
            loaded: loaded.next().unwrap_or_default(),
            wall: wall[i],
        });
        Ok(Paths { figures, command, threads })
    }

    /// Part 4: swaps through Hangar and by hand, alternating round by round.
    fn swaps(&self) -> Result<Swaps> {
        let models = [(SWAP_A, N_CTX), (SWAP_B, N_CTX_B)];
        let config = self.write_config("swap-config", &models, Some(1))?;
        let hangar = self.start_hangar(&config, "hangard-swap.log")?;
        let load = |name: &str| -> Result<Swap> {
            let wall = SystemTime::now();
            let total = self.admin(&hangar, &format!("/v1/admin/models/{name}/load"))?;
            Ok(Swap { wall: Some(wall), total, stopped: None, spawned: None })
        };
        load(SWAP_A)?;
        let command_a = self.command(&hangar, SWAP_A)?;
        let argv_a = self.argv(&command_a)?;
        let mut raw = Raw::start(&argv_a, &self.work, "raw-a.log")?;
        self.wait_health(&raw.health_url(), || raw.exited())?;
        raw.arm()?;

        eprintln!("swap: {SWAP_ROUNDS} rounds each way, through Hangar and by hand");
        let mut swaps = Swaps {
            hangar: Default::default(),
            raw: Default::default(),
            command_a,
            command_b: String::new(),
        };
        let mut argv_b = Vec::new();
        for round in 0..SWAP_ROUNDS {
            swaps.hangar[0].push(load(SWAP_B)?);
            if round == 0 {
                let a = self.row(&hangar, SWAP_A)?;
                let state = a.get("state").and_then(Value::as_str).unwrap_or("?");
                if state == "loaded" {
                    bail!("{SWAP_A} is still loaded after {SWAP_B}'s load: no eviction");
                }
                swaps.command_b = self.command(&hangar, SWAP_B)?;
                argv_b = self.argv(&swaps.command_b)?;
            }
            let swap;
            (raw, swap) = self.raw_swap(raw, &argv_b, &format!("raw-b-{round}.log"))?;
            swaps.raw[0].push(swap);
            swaps.hangar[1].push(load(SWAP_A)?);
            let swap;
            (raw, swap) = self.raw_swap(raw, &argv_a, &format!("raw-a-{round}.log"))?;
            swaps.raw[1].push(swap);
            eprintln!(
                "  round {}: hangar → B {:.1} ms, → A {:.1} ms; by hand → B {:.1} ms, → A {:.1} ms",
                round + 1,
                ms(swaps.hangar[0][round].total),
                ms(swaps.hangar[1][round].total),
                ms(swaps.raw[0][round].total),
                ms(swaps.raw[1][round].total),
            );
        }
        drop(raw);
        // Hangar's own phases, from the models' logs: the old engine's exit status and the
        // new engine's start are logged (to the millisecond) as they happen.
        let logs_a = self.engine_events(&hangar, SWAP_A)?;
        let logs_b = self.engine_events(&hangar, SWAP_B)?;
        for (swaps, (old, new)) in
            swaps.hangar.iter_mut().zip([(&logs_a, &logs_b), (&logs_b, &logs_a)])
        {
            for swap in swaps {
                swap.place(old, new);
            }
        }
        self.admin(&hangar, &format!("/v1/admin/models/{SWAP_A}/unload"))?;
        drop(hangar);
        Ok(swaps)
    }

    /// SIGTERM to `current`, wait for its exit, spawn `next` and poll its health until 200;
    /// the new process and the swap's phases.
    fn raw_swap(&self, mut current: Raw, next: &[String], log: &str) -> Result<(Raw, Swap)> {
        let started = Instant::now();
        current.terminate()?;
        let stopped = started.elapsed();
        let mut spawned = Raw::start(next, &self.work, log)?;
        let spawn_done = started.elapsed();
        self.wait_health(&spawned.health_url(), || spawned.exited())?;
        let total = started.elapsed();
        drop(current);
        spawned.arm()?;
        let swap = Swap { wall: None, total, stopped: Some(stopped), spawned: Some(spawn_done) };
        Ok((spawned, swap))
    }

    /// The engine starts and exits in a model's log (`GET …/logs`): (milliseconds of the UTC
    /// day, is a start).
    fn engine_events(&self, server: &Server, name: &str) -> Result<Vec<(i64, bool)>> {
        let path = format!("/v1/admin/models/{name}/logs?tail=2000");
        let mut response = self.agent.get(server.url(&path)).call()?;
        let body = response.body_mut().read_to_string()?;
        if response.status() != 200 {
            bail!("GET {path} answered {}: {body}", response.status());
        }
        let v: Value =
            serde_json::from_str(&body).with_context(|| format!("GET {path}: {body}"))?;
        let lines = v.get("lines").and_then(Value::as_array).cloned().unwrap_or_default();
        Ok(lines
            .iter()
            .filter(|l| l.get("stream").and_then(Value::as_str) == Some("hangar"))
            .filter_map(|l| {
                let line = l.get("line").and_then(Value::as_str)?;
                let at = day_ms(l.get("timestamp").and_then(Value::as_str)?)?;
                if line.starts_with("started pid ") {
                    Some((at, true))
                } else if line.starts_with("pid ") {
                    Some((at, false))
                } else {
                    None
                }
            })
            .collect())
    }

    /// Polls `url` every [`HEALTH_POLL`] until it answers 200; `exited` says whether the
    /// server is gone (then it never will). Each poll connects anew and no connection stays
    /// open: `llama-server` finishes an open keep-alive connection before it exits on
    /// SIGTERM, which made the next swap's stop ~100 ms slower.
    fn wait_health(&self, url: &str, mut exited: impl FnMut() -> Option<String>) -> Result<()> {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            // Refused until it listens, 503 while it loads.
            if let Ok(mut response) = self.probe.get(url).call() {
                let _ = response.body_mut().read_to_vec();
                if response.status() == 200 {
                    return Ok(());
                }
            }
            if let Some(why) = exited() {
                bail!("{url}: the server exited: {why}");
            }
            if Instant::now() >= deadline {
                bail!("{url} not 200 after {READY_LIMIT:?}");
            }
            std::thread::sleep(HEALTH_POLL);
        }
    }

    /// `hangard serve` on `config`, its output in `<work>/<log>`.
    fn start_hangar(&self, config: &Path, log: &str) -> Result<Server> {
        let log = self.work.join(log);
        let (child, base) = crate::e2e::spawn_serve(&self.hangard, config, &[], &self.work, &log)?;
        Ok(Server::new("hangar", child, base, log))
    }

    /// `POST path` (a load or unload) with an empty JSON body; its wall time. Anything but
    /// 200 is an error.
    fn admin(&self, server: &Server, path: &str) -> Result<Duration> {
        let started = Instant::now();
        let mut response = self.agent.post(server.url(path)).send_json(json!({}))?;
        let body = response.body_mut().read_to_string()?;
        let took = started.elapsed();
        let status = response.status();
        if status != 200 {
            bail!("POST {path} answered {status}: {body}; see {}", server.log.display());
        }
        Ok(took)
    }

    /// `GET /v1/admin/models/{name}`.
    fn row(&self, server: &Server, name: &str) -> Result<Value> {
        let path = format!("/v1/admin/models/{name}");
        let mut response = self.agent.get(server.url(&path)).call()?;
        let body = response.body_mut().read_to_string()?;
        let status = response.status();
        if status != 200 {
            bail!("GET {path} answered {status}: {body}; see {}", server.log.display());
        }
        serde_json::from_str(&body).with_context(|| format!("GET {path} is not JSON: {body}"))
    }

    /// `runtime_details[0]` of a loaded model.
    fn details(&self, server: &Server, name: &str) -> Result<Map<String, Value>> {
        let row = self.row(server, name)?;
        row.pointer("/runtime_details/0")
            .and_then(Value::as_object)
            .cloned()
            .with_context(|| format!("{name} has no runtime_details: {row}"))
    }

    /// `runtime_details[0].command` of a loaded model.
    fn command(&self, server: &Server, name: &str) -> Result<String> {
        let details = self.details(server, name)?;
        let command = details.get("command").and_then(Value::as_str);
        command.map(str::to_owned).with_context(|| format!("{name}: no command in {details:?}"))
    }

    /// A command line as Hangar reports it (joined with spaces) split back into its argv;
    /// checked against the model path, which must come out whole.
    fn argv(&self, command: &str) -> Result<Vec<String>> {
        let argv: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        let model = self.model.to_string_lossy();
        let m = argv.iter().position(|a| a == "-m").and_then(|i| argv.get(i + 1));
        if m.map(String::as_str) != Some(&*model) {
            bail!("cannot split `{command}` into its arguments (a path with spaces?)");
        }
        if !argv.iter().any(|a| a == "--port") {
            bail!("`{command}` has no --port");
        }
        Ok(argv)
    }

    /// A config directory `<work>/<dir>`: the given `llama_server` models on the fixture,
    /// disabled at start, `--no-webui`, other settings on their defaults.
    fn write_config(
        &self,
        dir: &str,
        models: &[(&str, u32)],
        max_llm: Option<u32>,
    ) -> Result<PathBuf> {
        let dir = self.work.join(dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut entries = Map::new();
        for (name, n_ctx) in models {
            let model = json!({
                "backend": "llama_server",
                "enabled": false,
                "model_path": self.model,
                "llama_server_binary_path": self.llama_server,
                "llama_server_n_ctx": n_ctx,
                "llama_server_extra_args": self.extra_args(),
            });
            entries.insert((*name).to_owned(), model);
        }
        let mut settings = json!({
            "host": "127.0.0.1",
            "auto_load": false,
            "models": entries,
        });
        if let Some(max) = max_llm {
            settings["max_loaded_models"] = json!({"llm": max});
        }
        let path = dir.join("settings.json");
        std::fs::write(&path, format!("{settings:#}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(dir)
    }
}

impl Target {
    /// One non-streamed chat completion; its wall time (request sent → body read).
    fn chat(&self, agent: &ureq::Agent, body: &str) -> Result<Duration> {
        let started = Instant::now();
        let mut response = agent
            .post(&self.chat_url)
            .content_type("application/json")
            .send(body)
            .with_context(|| format!("{}: chat completion", self.name))?;
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("{}: chat completion body", self.name))?;
        let took = started.elapsed();
        let status = response.status();
        if status != 200 || !text.contains("\"choices\"") {
            bail!("{}: chat completion answered {status}: {text}", self.name);
        }
        Ok(took)
    }
}

/// [`CLIENTS`] threads, each with its own agent (one keep-alive connection) and one warm-up
/// request, sending requests back to back for [`THROUGHPUT_BLOCK`]; the latency of every
/// completed request and the wall time from the common start to the last thread's end.
fn throughput(target: &Target, body: &str) -> Result<(Vec<Duration>, Duration)> {
    let barrier = Barrier::new(CLIENTS + 1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| -> Result<(Vec<Duration>, Instant)> {
                    let agent = client();
                    let warm = target.chat(&agent, body);
                    barrier.wait();
                    warm?;
                    let deadline = Instant::now() + THROUGHPUT_BLOCK;
                    let mut latencies = Vec::new();
                    while Instant::now() < deadline {
                        latencies.push(target.chat(&agent, body)?);
                    }
                    Ok((latencies, Instant::now()))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut all = Vec::new();
        let mut end = start;
        for thread in threads {
            let (latencies, done) =
                thread.join().map_err(|_| anyhow::anyhow!("a client panicked"))??;
            all.extend(latencies);
            end = end.max(done);
        }
        Ok((all, end - start))
    })
}

/// The chat request of every path: greedy, [`MAX_TOKENS`] tokens, not streamed.
fn chat_body() -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    })
    .to_string()
}

/// The HTTP client of the whole bench: keep-alive connections (idle ones reused for up to
/// [`IDLE_AGE`]), error statuses are answers, no redirects.
fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(64)
        .max_idle_connections_per_host(CLIENTS)
        .max_idle_age(IDLE_AGE)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .build()
        .new_agent()
}

/// A `llama-server` started by hand from Hangar's command line. Killed on drop.
struct Raw {
    child: Child,
    port: u16,
    /// A shell blocked reading its stdin that sends SIGTERM to `child` when a line comes: a
    /// signal without spawning `kill` inside the timed swap (xtask has no `unsafe` to call
    /// `kill(2)` itself).
    trigger: Option<(Child, ChildStdin)>,
}

impl Raw {
    /// Spawns `argv` with its `--port` replaced by a free one, output to `<work>/<log>`.
    fn start(argv: &[String], work: &Path, log: &str) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut args = argv[1..].to_vec();
        if let Some(i) = args.iter().position(|a| a == "--port") {
            args[i + 1] = port.to_string();
        }
        let log = work.join(log);
        let out = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&argv[0])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", argv[0]))?;
        Ok(Self { child, port, trigger: None })
    }

    fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/health", self.port)
    }

    fn exited(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|s| s.to_string())
    }

    /// Starts the SIGTERM trigger (outside the timed part).
    fn arm(&mut self) -> Result<()> {
        let script = format!("read line && kill -TERM {}", self.child.id());
        let mut shell = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .context("cannot start sh")?;
        let stdin = shell.stdin.take().context("no stdin")?;
        self.trigger = Some((shell, stdin));
        Ok(())
    }

    /// SIGTERM (through the armed trigger) and wait for the exit.
    fn terminate(&mut self) -> Result<()> {
        let (shell, mut stdin) = self.trigger.take().context("the SIGTERM trigger is not armed")?;
        stdin.write_all(b"\n")?;
        drop(stdin);
        self.child.wait()?;
        let mut shell = shell;
        shell.wait()?;
        Ok(())
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((mut shell, stdin)) = self.trigger.take() {
            drop(stdin);
            let _ = shell.wait();
        }
    }
}

/// How nginx is set up as the reference proxy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NginxSetup {
    /// As a user gets it: Debian's `worker_processes auto` and a bare `proxy_pass`.
    Defaults,
    /// Tuned for proxying an LLM server: upstream keep-alive, no buffering, one worker.
    Tuned,
}

impl NginxSetup {
    fn dir(self) -> &'static str {
        match self {
            Self::Defaults => "nginx-defaults",
            Self::Tuned => "nginx-tuned",
        }
    }
}

/// nginx in the foreground on a generated config. Stopped (SIGTERM, then SIGKILL) on drop.
struct Nginx {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    setup: NginxSetup,
}

impl Nginx {
    /// nginx on [`nginx_conf`] in `<work>/nginx-<setup>`, proxying to `upstream`
    /// (`host:port`).
    fn start(binary: &Path, work: &Path, upstream: &str, setup: NginxSetup) -> Result<Self> {
        let dir = &work.join(setup.dir());
        std::fs::create_dir_all(dir.join("temp"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir, upstream, port, is_root(), setup))
            .with_context(|| format!("cannot write {}", conf.display()))?;
        let log = dir.join("nginx.out");
        let out = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        Ok(Self { child, base: format!("http://127.0.0.1:{port}"), setup })
    }

    fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(format!("{status}; see target/bench/proxy/{}/error.log", self.setup.dir()))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker too (SIGKILL would leave the worker behind).
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx config: logs, pid and temp files under `dir`, loopback `port`, no access log.
/// [`NginxSetup::Defaults`]: Debian's `worker_processes auto` and `location / { proxy_pass
/// http://upstream; }`, nothing else. [`NginxSetup::Tuned`]: one worker, an upstream block
/// with a pool of keep-alive connections, HTTP/1.1 to it and no buffering (server-sent
/// events pass as they come). As root, the workers run as nobody.
fn nginx_conf(dir: &Path, upstream: &str, port: u16, root: bool, setup: NginxSetup) -> String {
    let d = dir.display();
    let user = if root { "user nobody nogroup;\n" } else { "" };
    let (workers, pool, proxy) = match setup {
        NginxSetup::Defaults => ("auto", String::new(), format!("proxy_pass http://{upstream};")),
        NginxSetup::Tuned => (
            "1",
            format!(
                "upstream llama {{\n        server {upstream};\n        keepalive 32;\n    }}\n    "
            ),
            "proxy_pass http://llama;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 300s;"
                .to_owned(),
        ),
    };
    format!(
        "{user}worker_processes {workers};
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
    client_body_temp_path {d}/temp/client_body;
    proxy_temp_path {d}/temp/proxy;
    fastcgi_temp_path {d}/temp/fastcgi;
    uwsgi_temp_path {d}/temp/uwsgi;
    scgi_temp_path {d}/temp/scgi;
    {pool}server {{
        listen 127.0.0.1:{port};
        location / {{
            {proxy}
        }}
    }}
}}
"
    )
}

/// nginx on `PATH` (or Debian's `/usr/sbin/nginx`); installed with apt when missing and
/// running as root.
fn ensure_nginx() -> Result<PathBuf> {
    if let Some(found) = find_nginx() {
        return Ok(found);
    }
    if !is_root() {
        bail!(
            "nginx is not installed: install the Debian package `{NGINX_PACKAGE}` (e.g. `sudo \
             apt-get install -y {NGINX_PACKAGE}`), or run as root, which installs it"
        );
    }
    eprintln!("nginx: not found, installing the Debian package `{NGINX_PACKAGE}`");
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "--no-install-recommends", NGINX_PACKAGE])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::io::stderr());
        run_checked(cmd)
    };
    if install().is_err() {
        let mut update = Command::new("apt-get");
        update.arg("update").stdout(std::io::stderr());
        run_checked(update)?;
        install()?;
    }
    find_nginx().with_context(|| format!("no nginx after installing `{NGINX_PACKAGE}`"))
}

fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The first line of `binary flag` that names a version (stdout or stderr).
fn version_line(binary: &Path, flag: &str) -> String {
    Command::new(binary)
        .arg(flag)
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            text.lines()
                .find(|l| l.contains("version") || l.starts_with("hangard"))
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_else(|| "version unknown".to_owned())
}

/// `git rev-parse --short HEAD`, marked when the tree has changes.
fn git_head(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "?".to_owned());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head} + uncommitted changes") } else { head }
}

/// The thread count `llama-server` logs at start (`llama threadpool init, n_threads = N`);
/// for Hangar's child that line is in `hangard`'s log.
fn llama_threads(log: &Path) -> Option<String> {
    let log = std::fs::read_to_string(log).ok()?;
    let line = log.lines().find_map(|l| l.split_once("threadpool init, "))?.1;
    Some(line.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// The `p`-quantile (nearest rank) of `samples`.
fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted.get(rank(sorted.len(), p)).copied().unwrap_or_default()
}

/// The index of the `p` quantile (nearest rank) in `len` sorted samples.
fn rank(len: usize, p: f64) -> usize {
    ((p * len as f64).ceil() as usize).clamp(1, len.max(1)) - 1
}

/// Microseconds.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One line of the goals table.
struct Row {
    measure: String,
    hangar: f64,
    reference: f64,
    /// `None` when the ratio means nothing (a reference ≤ 0).
    ratio: Option<f64>,
    goal: String,
    met: Option<bool>,
}

fn print_tables(bench: &Bench, versions: &Versions, paths: &Paths, swap: &Swaps) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "{FIXTURE} on {cores} cores ({}); non-streamed chat completions, temperature 0, \
         max_tokens {MAX_TOKENS}",
        cpu_model()
    );
    println!("hangar: {} ({}, {})", bench.hangard.display(), versions.hangar, versions.commit);
    println!("llama-server: {} ({})", bench.llama_server.display(), versions.llama_server);
    println!("nginx: {} ({})", bench.nginx.display(), versions.nginx);
    println!("upstream of every path (Hangar's child): {}", paths.command);
    if let Some(threads) = &paths.threads {
        println!("upstream threads: {threads}");
    }
    println!(
        "client: ureq, keep-alive connections on every path (one per path in the latency part, \
         one per client thread in the throughput part; idle ones reused for up to {} s)",
        IDLE_AGE.as_secs()
    );
    println!();

    let [direct, hangar, plain, tuned] = &paths.figures;
    let (d50, d99) = (us(percentile(&direct.latency, 0.5)), us(percentile(&direct.latency, 0.99)));
    println!(
        "| path | p50 µs | p99 µs | p50 − direct's µs | p99 − direct's µs | requests/s, \
         {CLIENTS} clients | vs direct | p50 / p99 / max ms, {CLIENTS} clients |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for f in &paths.figures {
        let (p50, p99) = (us(percentile(&f.latency, 0.5)), us(percentile(&f.latency, 0.99)));
        println!(
            "| {} | {p50:.0} | {p99:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} / {:.1} |",
            f.name,
            p50 - d50,
            p99 - d99,
            f.requests_per_second(),
            f.requests_per_second() / direct.requests_per_second(),
            ms(percentile(&f.loaded, 0.5)),
            ms(percentile(&f.loaded, 0.99)),
            ms(percentile(&f.loaded, 1.0)),
        );
    }
    println!();

    // The goal's statistic: quantiles of the same-round differences (proxy − direct), the
    // latency each request gained by its proxy. Drift between rounds cannot move them, where
    // a difference of two paths' quantiles can come out negative.
    let added = |f: &PathFigures, q: f64| {
        let mut d: Vec<f64> =
            f.latency.iter().zip(&direct.latency).map(|(p, d)| us(*p) - us(*d)).collect();
        d.sort_by(f64::total_cmp);
        d.get(rank(d.len(), q)).copied().unwrap_or_default()
    };
    let (h50, h99) = (added(hangar, 0.5), added(hangar, 0.99));
    let at_most = |h: f64, r: f64, goal: f64| {
        // A ratio of two added latencies means something only when both add something. A
        // Hangar that adds nothing meets any goal; otherwise the ratio decides.
        let ratio = (r > 0.0 && h > 0.0).then(|| h / r);
        let met = if h <= 0.0 { Some(true) } else { ratio.map(|x| x <= goal) };
        (ratio, met)
    };
    let mut rows = Vec::new();
    let mut noise = Vec::new();
    // Both sides on their defaults is the comparison of the goal; the tuned nginx is the
    // second, stricter reference.
    for (nginx, which) in [(plain, "goal"), (tuned, "second reference")] {
        let (n50, n99) = (added(nginx, 0.5), added(nginx, 0.99));
        for (label, h, n) in [("p50", h50, n50), ("p99", h99, n99)] {
            let (ratio, met) = at_most(h, n, LATENCY_GOAL);
            rows.push(Row {
                measure: format!(
                    "added latency {label} µs, {LATENCY_REQUESTS} same-round differences (ref: \
                     {}, {which})",
                    nginx.name
                ),
                hangar: h,
                reference: n,
                ratio,
                goal: format!("≤ {LATENCY_GOAL}"),
                met,
            });
            if n < NOISE_US {
                noise.push(format!("{} adds {n:.0} µs at {label}", nginx.name));
            }
        }
    }
    let (hr, dr) = (hangar.requests_per_second(), direct.requests_per_second());
    rows.push(Row {
        measure: format!("requests/s, {CLIENTS} clients (ref: direct)"),
        hangar: hr,
        reference: dr,
        ratio: Some(hr / dr),
        goal: format!("≥ {THROUGHPUT_GOAL}"),
        met: Some(hr / dr >= THROUGHPUT_GOAL),
    });
    let totals = |swaps: &[Swap]| swaps.iter().map(|s| s.total).collect::<Vec<_>>();
    let (mut all_hangar, mut all_raw) = (Vec::new(), Vec::new());
    for (i, label) in ["A → B", "B → A"].into_iter().enumerate() {
        let (mut h, mut r) = (totals(&swap.hangar[i]), totals(&swap.raw[i]));
        all_hangar.extend(&h);
        all_raw.extend(&r);
        let (h, r) = (ms(median(&mut h)), ms(median(&mut r)));
        rows.push(Row {
            measure: format!("swap {label} ms, median of {SWAP_ROUNDS} (ref: by hand)"),
            hangar: h,
            reference: r,
            ratio: Some(h / r),
            goal: format!("≤ {SWAP_GOAL}"),
            met: Some(h / r <= SWAP_GOAL),
        });
    }
    let (h, r) = (ms(median(&mut all_hangar)), ms(median(&mut all_raw)));
    rows.push(Row {
        measure: format!("swap ms, both ways, median of {} (ref: by hand)", 2 * SWAP_ROUNDS),
        hangar: h,
        reference: r,
        ratio: Some(h / r),
        goal: format!("≤ {SWAP_GOAL}"),
        met: Some(h / r <= SWAP_GOAL),
    });

    println!("| measure | hangar | reference | ratio | goal | met? |");
    println!("|---|---:|---:|---:|---:|---|");
    for row in &rows {
        let ratio = row.ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        };
        println!(
            "| {} | {:.1} | {:.1} | {ratio} | {} | {met} |",
            row.measure, row.hangar, row.reference, row.goal
        );
    }
    println!();
    for nginx in [plain, tuned] {
        println!(
            "{}: {:.0} requests/s = {:.2} × direct",
            nginx.name,
            nginx.requests_per_second(),
            nginx.requests_per_second() / dr
        );
    }
    if !noise.is_empty() {
        println!(
            "note: {}; below {NOISE_US:.0} µs the latency ratios are mostly noise: compare the \
             absolute µs",
            noise.join(", ")
        );
    }
    println!("swap A: {}", swap.command_a);
    println!("swap B: {}", swap.command_b);
    let list = |v: &[Swap]| v.iter().map(|s| format!("{:.1}", ms(s.total))).collect::<Vec<_>>();
    println!(
        "swap ms, each round: hangar → B {:?}, → A {:?}; by hand → B {:?}, → A {:?}",
        list(&swap.hangar[0]),
        list(&swap.hangar[1]),
        list(&swap.raw[0]),
        list(&swap.raw[1])
    );
    for (name, swaps) in [("hangar", &swap.hangar), ("by hand", &swap.raw)] {
        println!("swap phases, {name}: {}", phases(swaps.iter().flatten()));
    }
}

/// Medians of a swap's phases: old engine stopped, new one spawned, new one ready.
fn phases<'a>(swaps: impl Iterator<Item = &'a Swap>) -> String {
    let (mut stop, mut spawn, mut ready) = (Vec::new(), Vec::new(), Vec::new());
    for s in swaps {
        if let (Some(stopped), Some(spawned)) = (s.stopped, s.spawned) {
            stop.push(stopped);
            spawn.push(spawned.saturating_sub(stopped));
            ready.push(s.total.saturating_sub(spawned));
        }
    }
    if stop.is_empty() {
        return "not found".to_owned();
    }
    format!(
        "medians of {}: begin → old engine exited {:.1} ms, → new engine spawned +{:.1} ms, → \
         ready +{:.1} ms",
        stop.len(),
        ms(median(&mut stop)),
        ms(median(&mut spawn)),
        ms(median(&mut ready))
    )
}
