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
//!
//! The parts: `load` (the paths and the load they get), `nginx` (the reference proxy),
//! `swap` (swap timings and the by-hand reference) and `report` (the tables).

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

mod load;
mod nginx;
mod report;
mod swap;

use load::{Target, UPSTREAM_KEY, chat_body, client, throughput};
use nginx::{Nginx, NginxSetup, ensure_nginx};
use report::print_tables;
use swap::{Raw, Swap, Swaps, day_ms};

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
        // The paths that reach the child without Hangar send its key themselves.
        let child =
            |name, base: &str| Target { name, chat_url: chat(base), key: Some(UPSTREAM_KEY) };
        let targets: [Target; PATHS] = [
            child("direct", &upstream),
            Target { name: "hangar", chat_url: hangar.url("/v1/chat/completions"), key: None },
            child("nginx (defaults)", &plain.base),
            child("nginx (tuned)", &tuned.base),
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
                // Configured, so the direct and nginx paths can send it too.
                "llama_server_api_key": UPSTREAM_KEY,
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
