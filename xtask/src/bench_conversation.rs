//! The second part of `cargo xtask bench swap`: a returning conversation after a swap, with
//! its prompt cache saved and restored against computing its prompt again, on the trained
//! SmolLM2-135M-Instruct GGUF, through the in-process engine and through a `llama-server`
//! child, in one run.
//!
//! `hangard` (with a `state_dir`, so prompt caches are saved) serves [`IN_PROCESS`] and
//! [`CHILD`] on the file (2 sequences each) and a stub model [`OTHER`], with one slot for
//! generation models: loading one evicts the other. For each engine, [`ROUNDS`] rounds of:
//!
//! 1. a new conversation of about [`PROMPT_TOKENS`] tokens (its first line names the round,
//!    so no earlier cache covers it) gets its first answer;
//! 2. A → B → A: `POST …/other/load` (the chat model is evicted and saves its slots), then
//!    `POST …/<chat>/load` (timed);
//! 3. the conversation's second turn (the first turn, its answer and a short question) with
//!    `max_tokens` 1, so its time is the time to the first token: restored (timed), and the
//!    tokens the answer reports cached;
//! 4. an unrelated conversation of the same length, its second turn likewise (timed): the
//!    prompt computed again, as every swap did before.
//!
//! A table of medians: the load, both times to the first token, their ratio, and the cached
//! tokens.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::bench_llamacpp::{Bench, Server, median, ms, write_settings};
use crate::bench_swap::post;

/// The chat model in-process.
const IN_PROCESS: &str = "conv-inproc";
/// The chat model as a `llama-server` child.
const CHILD: &str = "conv-child";
/// The model whose load evicts the chat model.
const OTHER: &str = "other";
/// Rounds per engine.
const ROUNDS: usize = 4;
/// About how long each conversation's first turn is, in tokens.
const PROMPT_TOKENS: usize = 2000;
/// Each sequence's context, in tokens.
const N_CTX: u32 = 4096;

/// One engine's figures.
#[derive(Default)]
struct Figures {
    load: Vec<Duration>,
    restored: Vec<Duration>,
    computed: Vec<Duration>,
    cached: Vec<u64>,
    prompt: Vec<u64>,
}

/// Measures both engines on a server of its own and prints the table.
pub(crate) fn run(hangard: &Path, llama_server: &Path, model: &Path, work: &Path) -> Result<()> {
    let state = work.join("conversation-state");
    if state.exists() {
        std::fs::remove_dir_all(&state)?;
    }
    let config = write_config(work, model, llama_server, &state)?;
    let bench = Bench::new(
        hangard.to_owned(),
        llama_server.to_owned(),
        model.to_owned(),
        config,
        work.to_owned(),
    );
    let server = bench.start_hangard()?;
    let mut rows = Vec::new();
    for (label, chat) in [("in-process", IN_PROCESS), ("llama-server child", CHILD)] {
        let mut figures = Figures::default();
        for round in 0..ROUNDS {
            eprintln!("conversation: {label}, round {} of {ROUNDS}", round + 1);
            measure(&server, chat, round, &mut figures)?;
        }
        rows.push((label, figures));
    }
    print_table(&rows);
    Ok(())
}

/// A conversation's first user message, about [`PROMPT_TOKENS`] tokens, which `seed` makes
/// its own from the first token on.
fn first_message(seed: &str) -> String {
    let story = "The lighthouse keeper wrote down the colour of the sea every morning, the ships \
                 that passed, and the birds that rested on the rail. ";
    // SmolLM2's tokenizer: about 26 tokens a sentence.
    format!("{seed}\n{}What did the keeper write down?", story.repeat(PROMPT_TOKENS / 26))
}

/// One round on `chat` into `figures`.
fn measure(server: &Server, chat: &str, round: usize, figures: &mut Figures) -> Result<()> {
    post(server, &format!("/v1/admin/models/{chat}/load"))?;
    let returning = first_message(&format!("Conversation {round} of the keeper's log."));
    let first = complete(server, chat, &[user(&returning)], 16)?;
    let reply = first["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    // The fresh one's first turn is never sent: nothing of it is cached anywhere.
    let fresh = first_message(&format!("Unrelated log number {round} of another keeper."));

    post(server, &format!("/v1/admin/models/{OTHER}/load"))?;
    figures.load.push(post(server, &format!("/v1/admin/models/{chat}/load"))?);
    let turn = |first: &str| {
        vec![user(first), json!({ "role": "assistant", "content": reply }), user("And the ships?")]
    };
    let started = Instant::now();
    let answer = complete(server, chat, &turn(&returning), 1)?;
    figures.restored.push(started.elapsed());
    figures
        .cached
        .push(answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0));
    figures.prompt.push(answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0));
    let started = Instant::now();
    complete(server, chat, &turn(&fresh), 1)?;
    figures.computed.push(started.elapsed());
    Ok(())
}

fn user(content: &str) -> Value {
    json!({ "role": "user", "content": content })
}

/// A greedy chat completion of `max_tokens`; its answer (which must be 200).
fn complete(server: &Server, model: &str, messages: &[Value], max_tokens: u32) -> Result<Value> {
    let body = json!({
        "model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens,
    });
    let mut response = server.agent.post(server.url("/v1/chat/completions")).send_json(&body)?;
    let text = response.body_mut().read_to_string()?;
    if response.status() != 200 {
        bail!("{model} answered {}: {text}", response.status());
    }
    Ok(serde_json::from_str(&text)?)
}

/// Both chat models on `model` (one slot between them and the stub), caches saved under
/// `state`.
fn write_config(
    work: &Path,
    model: &Path,
    llama_server: &Path,
    state: &Path,
) -> Result<std::path::PathBuf> {
    let in_process = json!({
        "backend": "llama_cpp", "model_path": model, "prompt_format": "auto",
        "gguf_n_ctx": N_CTX, "gguf_n_gpu_layers": 0, "target_inflight": 2,
    });
    let child = json!({
        "backend": "llama_server", "model_path": model, "llama_server_binary_path": llama_server,
        "llama_server_n_ctx": 2 * N_CTX, "llama_server_n_gpu_layers": 0, "target_inflight": 2,
        "llama_server_extra_args": ["--no-webui"],
    });
    let settings = json!({
        "host": "127.0.0.1",
        "auto_load": false,
        "state_dir": state,
        "max_loaded_models": { "llm": 1 },
        "models": { IN_PROCESS: in_process, CHILD: child, OTHER: { "backend": "stub" } },
    });
    write_settings(work, "conversation-config", &settings)
}

fn print_table(rows: &[(&str, Figures)]) {
    let med = |v: &[Duration]| ms(median(&mut v.to_vec()));
    println!();
    println!(
        "A returning conversation after A → B → A (second turn of a ~{PROMPT_TOKENS}-token conversation, time to the first token), SmolLM2-135M-Instruct Q4_1, medians of {ROUNDS} rounds, ms"
    );
    println!();
    println!(
        "| engine | load of A | prompt tokens | cached (restored) | first token, restored | first token, computed again | restored / computed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, f) in rows {
        let mut cached = f.cached.clone();
        cached.sort_unstable();
        let mut prompt = f.prompt.clone();
        prompt.sort_unstable();
        let (restored, computed) = (med(&f.restored), med(&f.computed));
        println!(
            "| {label} | {:.1} | {} | {} | {restored:.1} | {computed:.1} | {:.3} |",
            med(&f.load),
            prompt[prompt.len() / 2],
            cached[cached.len() / 2],
            restored / computed
        );
    }
}
