//! `cargo xtask bench bridge`: what the Python bridge costs per generated token. CTranslate2
//! through Hangar (`hangard` → Unix socket → the reference worker → `Generator`) against the
//! same `Generator` called directly in Python, same model, settings and prompt, in one run.
//!
//! 1. The bridge virtualenv (`target/bridge-venv`) and the release `hangard` are built when
//!    needed; `hangard` runs a config of one `ct2` model, the fixture [`FIXTURE`] on the CPU
//!    (float32, one intra-op thread).
//! 2. The reference is `xtask/bench/ct2_direct.py`: the model loaded once, then greedy
//!    generations from the raw prompt `A hangar is` with `max_length` N, token ids
//!    collected and the text decoded at the end.
//! 3. Through Hangar: `POST /v1/completions` with the same prompt, `temperature: 0` and
//!    `max_tokens` N, non-streamed and streamed (SSE read event by event).
//! 4. For N = [`SHORT`] and N = [`LONG`] (greedy decoding of this prompt meets no end token,
//!    so each side generates exactly N tokens; checked), [`ROUNDS`] requests per side in each
//!    of [`BLOCKS`] interleaved blocks. The per-token cost is the slope between the two
//!    medians, (t(LONG) − t(SHORT)) / (LONG − SHORT): what one more token costs, with the
//!    per-request cost (HTTP, admission, prompt) taken out; that is printed too.
//!
//! The tiny fixture computes a token in about 0.3 ms, so the ratio is the bridge's worst
//! case: a real model spends far longer per token in the engine while the bridge's cost per
//! token (one JSON line, a channel hop, an SSE event) stays the same.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::bench_llamacpp::{Server, median, ms};
use crate::{cargo, run as run_checked};

/// The model, relative to the workspace root.
const FIXTURE: &str = "fixtures/models/tiny-ct2";
/// Its name in Hangar's config.
const MODEL: &str = "tiny-ct2";
/// The raw prompt of every request (greedy decoding of it meets no end token).
const PROMPT: &str = "A hangar is";
/// The short generation.
const SHORT: u32 = 16;
/// The long generation.
const LONG: u32 = 1024;
/// Requests per side, size and block.
const ROUNDS: usize = 5;
/// Interleaved blocks (direct, hangar, direct, …).
const BLOCKS: usize = 3;

/// Seconds of each request, per way and size.
#[derive(Default)]
struct Samples {
    direct: [Vec<Duration>; 2],
    hangar: [Vec<Duration>; 2],
    stream: [Vec<Duration>; 2],
}

pub(crate) fn run(root: &Path) -> Result<()> {
    let python = crate::venv::ensure_bridge(root)?;
    let mut build = cargo(root);
    build.args(["build", "--release", "--locked", "-p", "hangard"]);
    run_checked(build)?;
    let target = crate::target_dir(root)?;
    let hangard = target.join("release").join("hangard");
    let work = target.join("bench").join("bridge");
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let model = root.join(FIXTURE).canonicalize().context("the ct2 fixture")?;
    let config = write_config(&work, &model, &python)?;

    let log = work.join("hangard.log");
    let (child, base) = crate::e2e::spawn_serve(&hangard, &config, &[], &work, &log)?;
    let server = Server::new("hangar", child, base, log);
    load(&server)?;
    let details = server_details(&server)?;

    let script = root.join("xtask/bench/ct2_direct.py");
    let mut samples = Samples::default();
    for block in 0..BLOCKS {
        eprintln!("block {}/{BLOCKS}: direct, then through hangar", block + 1);
        direct(&python, &script, &model, &mut samples)?;
        for _ in 0..ROUNDS {
            for (i, n) in [SHORT, LONG].into_iter().enumerate() {
                samples.hangar[i].push(complete(&server, n, false)?);
                samples.stream[i].push(complete(&server, n, true)?);
            }
        }
    }
    print(&mut samples, &details);
    Ok(())
}

/// One block of the reference: a fresh Python process, the model loaded once, [`ROUNDS`]
/// generations of each size (load time excluded).
fn direct(python: &Path, script: &Path, model: &Path, samples: &mut Samples) -> Result<()> {
    let output = Command::new(python)
        .arg(script)
        .arg(model)
        .arg(ROUNDS.to_string())
        .args([SHORT.to_string(), LONG.to_string()])
        .output()
        .context("cannot run the direct CTranslate2 reference")?;
    if !output.status.success() {
        bail!("ct2_direct.py failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let v: Value = serde_json::from_slice(&output.stdout).context("ct2_direct.py output")?;
    for (i, n) in [SHORT, LONG].into_iter().enumerate() {
        let tokens = v.pointer(&format!("/tokens/{n}")).and_then(Value::as_u64);
        if tokens != Some(u64::from(n)) {
            bail!("the direct run generated {tokens:?} tokens for max_length {n}");
        }
        let times = v[n.to_string()].as_array().context("ct2_direct.py times")?;
        samples.direct[i]
            .extend(times.iter().filter_map(Value::as_f64).map(Duration::from_secs_f64));
    }
    Ok(())
}

/// One `POST /v1/completions` of `n` tokens, streamed or not; its wall time. The answer must
/// have exactly `n` tokens.
fn complete(server: &Server, n: u32, stream: bool) -> Result<Duration> {
    let body = json!({
        "model": MODEL, "prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": stream,
        "stream_options": { "include_usage": true },
    });
    let started = Instant::now();
    let mut response = server.agent.post(server.url("/v1/completions")).send_json(&body)?;
    if response.status() != 200 {
        bail!(
            "completion answered {}: {}",
            response.status(),
            response.body_mut().read_to_string()?
        );
    }
    let mut tokens = None;
    if stream {
        let mut reader = BufReader::new(response.body_mut().as_reader());
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 {
            if let Some(data) = line.strip_prefix("data:").map(str::trim) {
                if data == "[DONE]" {
                    break;
                }
                let v: Value = serde_json::from_str(data)?;
                tokens = v.pointer("/usage/completion_tokens").and_then(Value::as_u64).or(tokens);
            }
            line.clear();
        }
    } else {
        let v: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
        tokens = v.pointer("/usage/completion_tokens").and_then(Value::as_u64);
    }
    let elapsed = started.elapsed();
    if tokens != Some(u64::from(n)) {
        bail!("hangar generated {tokens:?} tokens for max_tokens {n} (stream: {stream})");
    }
    Ok(elapsed)
}

fn write_config(work: &Path, model: &Path, python: &Path) -> Result<PathBuf> {
    let dir = work.join("config");
    std::fs::create_dir_all(&dir)?;
    let settings = json!({
        "auto_load": false,
        "models": { MODEL: {
            "backend": "ct2",
            "model_path": model,
            "device": "cpu",
            "bridge_python": std::path::absolute(python)?,
            "ct2_compute_type": "float32",
            "ct2_intra_threads": 1,
        } },
    });
    std::fs::write(dir.join("settings.json"), serde_json::to_vec_pretty(&settings)?)?;
    Ok(dir)
}

fn load(server: &Server) -> Result<()> {
    let url = server.url(&format!("/v1/admin/models/{MODEL}/load"));
    let mut response = server.agent.post(url).send_json(json!({}))?;
    let body = response.body_mut().read_to_string()?;
    if response.status() != 200 {
        bail!("load answered {}: {body}", response.status());
    }
    Ok(())
}

/// `ctranslate2_version`, `compute_type` and `worker` of the loaded replica.
fn server_details(server: &Server) -> Result<String> {
    let mut response = server.agent.get(server.url(&format!("/v1/admin/models/{MODEL}"))).call()?;
    let row: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
    let d = &row["runtime_details"][0];
    Ok(format!(
        "CTranslate2 {} ({}), worker {}",
        d["ctranslate2_version"].as_str().unwrap_or("?"),
        d["compute_type"].as_str().unwrap_or("?"),
        d["worker"].as_str().unwrap_or("?")
    ))
}

/// Per-token slope and per-request intercept of a way, in milliseconds.
fn slope(samples: &mut [Vec<Duration>; 2]) -> (f64, f64, f64) {
    let short = ms(median(&mut samples[0]));
    let long = ms(median(&mut samples[1]));
    let per_token = (long - short) / f64::from(LONG - SHORT);
    (per_token, short - per_token * f64::from(SHORT), long)
}

fn print(samples: &mut Samples, details: &str) {
    let direct = slope(&mut samples.direct);
    let hangar = slope(&mut samples.hangar);
    let stream = slope(&mut samples.stream);
    println!();
    println!("bench bridge: {MODEL} ({details}); CPU: {}", crate::bench_llamacpp::cpu_model());
    println!(
        "  medians of {} requests per cell; per token = slope between {SHORT} and {LONG} tokens",
        ROUNDS * BLOCKS
    );
    println!();
    println!("| way | {LONG} tokens, ms | per token, µs | per request, ms | per token vs direct |");
    println!("|---|---|---|---|---|");
    for (name, (per_token, fixed, long)) in [
        ("direct (Python, same Generator)", direct),
        ("hangar, /v1/completions", hangar),
        ("hangar, /v1/completions stream", stream),
    ] {
        println!(
            "| {name} | {long:.1} | {:.1} | {fixed:.2} | {:.2} |",
            per_token * 1000.0,
            per_token / direct.0
        );
    }
    println!();
    println!(
        "bridge overhead per token: {:.1} µs (non-streamed), {:.1} µs (streamed)",
        (hangar.0 - direct.0) * 1000.0,
        (stream.0 - direct.0) * 1000.0
    );
}
