//! `cargo xtask bench swap`: what the warm tier saves. A model brought back from sleep
//! against the same model loaded cold, and against `llama-server` started on the same file,
//! on the trained SmolLM2-135M-Instruct GGUF (`cargo xtask fixtures`), in one run.
//!
//! 1. The release `hangard` and the cached `llama-server` ([`crate::bench_llamacpp::setup`]).
//!    `hangard` serves two in-process `llama_cpp` models on the file, [`SWAP_A`] and
//!    [`SWAP_B`] (context [`N_CTX`], 4 sequences each, CPU only, room for both).
//! 2. [`ROUNDS`] rounds, each measuring, for A alone and then with B loaded and busy beside
//!    it (one request running on B throughout):
//!    - cold: `POST /v1/admin/models/A/unload`, then `POST …/A/load` (timed), then one chat
//!      completion (timed): the time back to a first answer is their sum;
//!    - warm: `POST …/A/sleep` (timed), then one chat completion (timed): the request wakes
//!      A — the engine creates its context again and answers the wake check — and is
//!      answered; then, to tell the two apart, a sleep, `POST …/A/wake` (timed) and the
//!      completion (timed);
//!    - the reference: `llama-server` spawned on the same file and context, until
//!      `GET /health` answers 200 (timed), then the same completion (timed), then killed.
//! 3. A table of medians and the ratios warm / cold and warm / `llama-server`.
//!
//! Every completion is greedy, [`MAX_TOKENS`] tokens of one fixed prompt: the same work in
//! every path, so the differences are the way back, not the answer.
//!
//! Then a returning conversation after a swap, its prompt cache restored against computed
//! again ([`crate::bench_conversation`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::bench_llamacpp::{Bench, Server, Setup, median, ms, write_settings};

/// The model put to sleep and loaded cold.
const SWAP_A: &str = "swap-a";
/// The model beside it.
const SWAP_B: &str = "swap-b";
/// Each model's context per sequence, in tokens.
const N_CTX: u32 = 4096;
/// Sequences of each model (what a chat server of a few users runs).
const SEQUENCES: u32 = 4;
/// Rounds of each measure.
const ROUNDS: usize = 8;
/// Tokens of each timed answer.
const MAX_TOKENS: u32 = 16;
/// The prompt of every timed answer.
const PROMPT: &str = "Name three colours of the sea.";

/// One round's figures of one setting (alone, or beside a busy model).
#[derive(Default)]
struct Figures {
    cold_load: Vec<Duration>,
    cold_answer: Vec<Duration>,
    sleep: Vec<Duration>,
    warm_answer: Vec<Duration>,
    wake: Vec<Duration>,
    woken_answer: Vec<Duration>,
    reference_ready: Vec<Duration>,
    reference_answer: Vec<Duration>,
}

/// Builds both servers (when needed), measures, prints the table.
pub(crate) fn run(root: &Path) -> Result<()> {
    let Setup { hangard, llama_server, work, .. } = crate::bench_llamacpp::setup(root, "swap")?;
    let model = crate::trained::ensure(root)?.join(crate::trained::CHAT_FILE);
    let config = write_config(&work, &model)?;
    let bench = Bench::new(hangard, llama_server, model, config, work);
    let server = bench.start_hangard()?;
    for name in [SWAP_A, SWAP_B] {
        post(&server, &format!("/v1/admin/models/{name}/load"))?;
    }
    // Warm-up: the file in the page cache, one answer from each.
    answer(&server, SWAP_A)?;
    answer(&server, SWAP_B)?;
    let mut alone = Figures::default();
    let mut beside = Figures::default();
    for round in 0..ROUNDS {
        eprintln!("swap: round {} of {ROUNDS}", round + 1);
        measure(&bench, &server, &mut alone)?;
        let busy = keep_busy(&server)?;
        measure(&bench, &server, &mut beside)?;
        busy.join().map_err(|_| anyhow::anyhow!("the busy requests panicked"))??;
    }
    print_table(&alone, &beside);
    drop(server);
    crate::bench_conversation::run(&bench.hangard, &bench.llama_server, &bench.model, &bench.work)
}

/// One round of every measure into `figures`.
fn measure(bench: &Bench, server: &Server, figures: &mut Figures) -> Result<()> {
    post(server, &format!("/v1/admin/models/{SWAP_A}/unload"))?;
    figures.cold_load.push(post(server, &format!("/v1/admin/models/{SWAP_A}/load"))?);
    figures.cold_answer.push(answer(server, SWAP_A)?);
    figures.sleep.push(post(server, &format!("/v1/admin/models/{SWAP_A}/sleep"))?);
    figures.warm_answer.push(answer(server, SWAP_A)?);
    post(server, &format!("/v1/admin/models/{SWAP_A}/sleep"))?;
    figures.wake.push(post(server, &format!("/v1/admin/models/{SWAP_A}/wake"))?);
    figures.woken_answer.push(answer(server, SWAP_A)?);
    let n_ctx = (N_CTX * SEQUENCES).to_string();
    let sequences = SEQUENCES.to_string();
    let args = ["-c", &n_ctx, "-np", &sequences, "--no-webui"];
    let reference = bench.spawn_llama_server(&args, "llama-server.log")?;
    figures.reference_ready.push(reference.ready());
    figures.reference_answer.push(answer(&reference, "model")?);
    Ok(())
}

/// Requests on B, one after another, until about as long as a round takes.
fn keep_busy(server: &Server) -> Result<std::thread::JoinHandle<Result<()>>> {
    let (agent, url) = (server.agent.clone(), server.url("/v1/chat/completions"));
    let body = json!({
        "model": SWAP_B,
        "messages": [{ "role": "user", "content": "Write a long story about the sea." }],
        "max_tokens": 256,
    });
    Ok(std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            let mut response = agent.post(&url).send_json(&body)?;
            let _ = response.body_mut().read_to_vec()?;
        }
        Ok(())
    }))
}

/// `POST path` with `{}`; must answer 200. Its wall time.
pub(crate) fn post(server: &Server, path: &str) -> Result<Duration> {
    let started = Instant::now();
    let mut response = server.agent.post(server.url(path)).send_json(json!({}))?;
    let body = response.body_mut().read_to_string()?;
    let elapsed = started.elapsed();
    if response.status() != 200 {
        bail!("POST {path} answered {}: {body}", response.status());
    }
    Ok(elapsed)
}

/// One greedy answer of `model`; its wall time.
fn answer(server: &Server, model: &str) -> Result<Duration> {
    let body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": PROMPT }],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    });
    let started = Instant::now();
    let mut response = server.agent.post(server.url("/v1/chat/completions")).send_json(&body)?;
    let text = response.body_mut().read_to_string()?;
    let elapsed = started.elapsed();
    if response.status() != 200 {
        bail!("{} answered {}: {text}", server.name, response.status());
    }
    let answer: Value = serde_json::from_str(&text)?;
    if answer["choices"][0]["message"]["content"].as_str().is_none_or(str::is_empty) {
        bail!("{} answered no text: {text}", server.name);
    }
    Ok(elapsed)
}

/// The config: both models on `model`, room for both, nothing loaded at start.
fn write_config(work: &Path, model: &Path) -> Result<std::path::PathBuf> {
    let one = json!({
        "backend": "llama_cpp",
        "model_path": model,
        "prompt_format": "auto",
        "gguf_n_ctx": N_CTX,
        "gguf_n_gpu_layers": 0,
        "target_inflight": SEQUENCES,
    });
    let settings = json!({
        "host": "127.0.0.1",
        "auto_load": false,
        "max_loaded_models": { "llm": 2 },
        "models": { SWAP_A: one.clone(), SWAP_B: one },
    });
    write_settings(work, "config", &settings)
}

fn print_table(alone: &Figures, beside: &Figures) {
    let med = |v: &[Duration]| ms(median(&mut v.to_vec()));
    println!();
    println!(
        "Back to a first answer ({MAX_TOKENS} greedy tokens), SmolLM2-135M-Instruct Q4_1, {SEQUENCES} × {N_CTX} tokens of context, medians of {ROUNDS} rounds, ms"
    );
    println!();
    println!(
        "| setting | cold: load | cold: answer | cold: total | sleep | warm: wake + answer | wake alone | answer after it | llama-server: start | llama-server: answer | warm / cold | warm / llama-server |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, f) in [("alone", alone), ("beside a busy model", beside)] {
        let cold = med(&f.cold_load) + med(&f.cold_answer);
        let warm = med(&f.warm_answer);
        let reference = med(&f.reference_ready) + med(&f.reference_answer);
        println!(
            "| {name} | {:.1} | {:.1} | {cold:.1} | {:.1} | {warm:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} |",
            med(&f.cold_load),
            med(&f.cold_answer),
            med(&f.sleep),
            med(&f.wake),
            med(&f.woken_answer),
            med(&f.reference_ready),
            med(&f.reference_answer),
            warm / cold,
            warm / reference
        );
    }
}
