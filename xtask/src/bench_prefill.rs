//! The prefill section of `cargo xtask bench llamacpp`: how fast each server reads a long
//! prompt (over 2,000 tokens), both on their defaults.
//!
//! - **hangar**: one `llama_cpp` entry with `gguf_n_ctx` [`PROMPT_CTX`], engine defaults
//!   otherwise (no thread count), loaded through the admin API.
//! - **llama-server**: `-c PROMPT_CTX -np 1`, its prompt cache on (its default).
//!
//! Each request is a chat whose one user message is [`long_prompt`]: a request number first,
//! so no server can reuse more than the chat template's shared head (the system prompt),
//! then numbered sentences for at least [`PROMPT_TOKENS`] tokens. `max_tokens: 1`,
//! `temperature: 0`, not streamed: the client's wall time is the prefill plus one token and
//! the HTTP round trip. [`ROUNDS`] requests per server after one warm-up each, interleaved
//! (hangar, llama-server, llama-server, hangar, …) so load elsewhere on the host hits both
//! alike. Reported: the median request time and the prompt tokens per second it gives
//! (`usage.prompt_tokens` over that time), with their ratios.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::bench_llamacpp::{Bench, MODEL, Server, complete, cpu_model, median, ms};

/// The context of both servers in this section: room for the prompt and its answer.
const PROMPT_CTX: u32 = 4096;
/// The least number of prompt tokens each request carries.
const PROMPT_TOKENS: usize = 2000;
/// Timed requests per server.
const ROUNDS: usize = 6;

/// Measures both servers and prints the prefill table; both are killed on return.
pub(crate) fn run(bench: &Bench) -> Result<()> {
    let config = write_config(bench)?;
    let log = bench.work.join("hangard-prefill.log");
    let (child, base) = crate::e2e::spawn_serve(&bench.hangard, &config, &[], &bench.work, &log)?;
    let hangar = Server::new("hangar", child, base, log);
    crate::bench_streams::admin(&hangar, &format!("/v1/admin/models/{MODEL}/load"))?;
    let ctx = PROMPT_CTX.to_string();
    let args = ["-c", &ctx, "-np", "1", "--no-webui"];
    let llama = bench.spawn_llama_server(&args, "llama-server-prefill.log")?;
    let servers = [&hangar, &llama];

    eprintln!("prefill: {ROUNDS} prompts of at least {PROMPT_TOKENS} tokens per server");
    for server in servers {
        measure(server, ROUNDS)?;
    }
    let mut samples = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            samples[i].push(measure(servers[i], round)?);
        }
    }
    let [h, l] = samples.map(|s| summarize(&s));
    eprintln!(
        "  hangar: {} prompt tokens, {:.0} tokens/s; llama-server: {} prompt tokens, {:.0} \
         tokens/s",
        h.prompt_tokens, h.rate, l.prompt_tokens, l.rate
    );
    if h.prompt_tokens.abs_diff(l.prompt_tokens) > 8 {
        bail!(
            "the servers read prompts of different lengths ({} and {} tokens): their chat \
             templates differ",
            h.prompt_tokens,
            l.prompt_tokens
        );
    }
    println!();
    println!(
        "Prefill: {} on {} cores ({}), CPU only, both servers on their defaults, context \
         {PROMPT_CTX}; {ROUNDS} chat requests of {} prompt tokens each (a distinct head, so \
         only the system prompt is reusable), max_tokens 1, temperature 0, not streamed",
        crate::bench_llamacpp::model_name(&bench.model),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        h.prompt_tokens
    );
    println!();
    println!("| measure | hangar | llama-server | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| prompt tokens/s of the median request (higher is better) | {:.0} | {:.0} | {:.2} |",
        h.rate,
        l.rate,
        h.rate / l.rate
    );
    println!(
        "| request ms, median | {:.0} | {:.0} | {:.2} |",
        ms(h.elapsed),
        ms(l.elapsed),
        ms(h.elapsed) / ms(l.elapsed)
    );
    Ok(())
}

/// One timed prefill request.
struct Sample {
    prompt_tokens: u64,
    elapsed: Duration,
}

/// One server's median request.
struct Summary {
    prompt_tokens: u64,
    rate: f64,
    elapsed: Duration,
}

/// The median request of `samples` and its prompt tokens per second.
fn summarize(samples: &[Sample]) -> Summary {
    let mut elapsed: Vec<Duration> = samples.iter().map(|s| s.elapsed).collect();
    let elapsed = median(&mut elapsed);
    let prompt_tokens = samples.iter().map(|s| s.prompt_tokens).max().unwrap_or(0);
    Summary { prompt_tokens, rate: prompt_tokens as f64 / elapsed.as_secs_f64(), elapsed }
}

/// One request of [`long_prompt`]`(tag)` to `server`.
fn measure(server: &Server, tag: usize) -> Result<Sample> {
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": long_prompt(tag)}],
        "temperature": 0,
        "max_tokens": 1,
    });
    let done = complete(server, &body)
        .with_context(|| format!("prefill request {tag}; see {}", server.log.display()))?;
    if done.prompt_tokens < PROMPT_TOKENS as u64 {
        bail!("{}: a prefill prompt was only {} tokens", server.name, done.prompt_tokens);
    }
    Ok(Sample { prompt_tokens: done.prompt_tokens, elapsed: done.elapsed })
}

/// A user message of at least [`PROMPT_TOKENS`] tokens that starts with `tag`: numbered
/// sentences of everyday words, one per 16 of [`PROMPT_TOKENS`] (SmolLM2's tokenizer reads
/// them as about 21 tokens each: 2,650 in all, with the chat template).
fn long_prompt(tag: usize) -> String {
    const THINGS: [&str; 8] =
        ["river", "garden", "market", "library", "harbour", "valley", "bridge", "tower"];
    const DEEDS: [&str; 6] = [
        "walked past",
        "painted",
        "counted the stones of",
        "sang near",
        "slept beside",
        "measured",
    ];
    let mut text = format!("Request {tag}. Read these notes, then say which place came first.\n");
    for i in 0..PROMPT_TOKENS / 16 {
        let (thing, deed) = (THINGS[i % THINGS.len()], DEEDS[i % DEEDS.len()]);
        text.push_str(&format!(
            "Note {i}: on day {}, a traveller {deed} the old {thing}.\n",
            i * 7 % 31 + 1
        ));
    }
    text
}

/// The config directory of this section: one CPU-only `llama_cpp` model on engine defaults,
/// not loaded at start.
fn write_config(bench: &Bench) -> Result<std::path::PathBuf> {
    let settings = json!({
        "host": "127.0.0.1",
        "auto_load": false,
        "models": {
            MODEL: {
                "backend": "llama_cpp",
                "enabled": false,
                "model_path": bench.model,
                "prompt_format": "auto",
                "gguf_n_ctx": PROMPT_CTX,
                "gguf_n_gpu_layers": 0,
            }
        }
    });
    crate::bench_llamacpp::write_settings(&bench.work, "prefill-config", &settings)
}
