//! Continuous batching on the tiny GGUF: sequences that share one context's batch do not
//! interfere, leave without disturbing the others, and reuse a slot's KV prefix.
//!
//! Overlap is forced, not hoped for: a client that does not read its events (a channel of
//! one) holds its sequence in the batch, so every sequence started that way is in the
//! context at once, which the runtime's slot report then shows.

use std::sync::Arc;
use std::time::Duration;

use hangar_backend::{
    GenerateEvent, GenerateRequest, GenerateSummary, OutputFormat, Prompt, RuntimeError,
    SamplingParams,
};
use hangar_backend_llamacpp::{LlamaCppBackend, LlamaCppRuntime, SlotState};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support;

const PROMPTS: [&str; 4] = [
    "The hangar doors opened and",
    "Once upon a time in a small village",
    "List three colours:",
    "A long time ago",
];

/// A replica of the tiny model serving `sequences` sequences, greedy.
async fn load(sequences: u32, n_ctx: u32) -> Arc<LlamaCppRuntime> {
    let model = support::tiny(json!({ "gguf_n_ctx": n_ctx, "target_inflight": sequences }));
    let request = support::load_request(model, 0, 1);
    LlamaCppBackend::new(support::llama()).load_replica(request).await.expect("fixture loads")
}

/// A greedy (`temperature: 0`) completion of `prompt`: the engine samples by default.
fn text(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ..Default::default()
        },
        ..GenerateRequest::new(Prompt::Text(prompt.to_owned()))
    }
}

/// A generation whose client has not started reading: its events wait in a channel of one.
struct Held {
    task: JoinHandle<Result<GenerateSummary, RuntimeError>>,
    events: mpsc::Receiver<GenerateEvent>,
}

fn start(runtime: &Arc<LlamaCppRuntime>, request: GenerateRequest) -> Held {
    let (tx, events) = mpsc::channel(1);
    let runtime = Arc::clone(runtime);
    let task =
        tokio::spawn(
            async move { hangar_backend::Runtime::generate(&*runtime, request, tx).await },
        );
    Held { task, events }
}

impl Held {
    /// Reads every event; returns the text and the summary.
    async fn finish(mut self) -> (String, GenerateSummary) {
        let mut out = String::new();
        while let Some(event) = self.events.recv().await {
            if let GenerateEvent::Text(piece) = event {
                out.push_str(&piece);
            }
        }
        (out, self.task.await.expect("task").expect("generates"))
    }
}

/// Generates alone (nothing else in the context); returns the text and the summary.
async fn alone(
    runtime: &Arc<LlamaCppRuntime>,
    request: GenerateRequest,
) -> (String, GenerateSummary) {
    let (tx, mut rx) = mpsc::channel(4096);
    let summary =
        hangar_backend::Runtime::generate(&**runtime, request, tx).await.expect("generates");
    let mut out = String::new();
    while let Some(GenerateEvent::Text(piece)) = rx.recv().await {
        out.push_str(&piece);
    }
    (out, summary)
}

/// Waits until `busy` slots hold a sequence; returns the report.
async fn until_busy(runtime: &LlamaCppRuntime, busy: usize) -> Vec<SlotState> {
    for _ in 0..2000 {
        let slots = runtime.slots().await.expect("slots");
        if slots.iter().filter(|s| s.busy).count() == busy {
            return slots;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("never {busy} busy slots: {:?}", runtime.slots().await);
}

#[tokio::test(flavor = "multi_thread")]
async fn batched_sequences_give_the_tokens_they_give_alone() {
    let runtime = load(4, 256).await;
    assert_eq!(runtime.info().n_seq_max, 4);
    assert_eq!(runtime.info().n_ctx_seq, 256);
    let mut solo = Vec::new();
    for prompt in PROMPTS {
        solo.push(alone(&runtime, text(prompt, 48)).await);
    }
    // Different prompts and lengths: prompt chunks and decoded tokens share steps.
    let held: Vec<Held> = PROMPTS.iter().map(|p| start(&runtime, text(p, 48))).collect();
    until_busy(&runtime, 4).await;
    for (held, (want, want_summary)) in held.into_iter().zip(&solo) {
        let (got, summary) = held.finish().await;
        assert_eq!(&got, want, "a batched sequence differs from its solo run");
        assert_eq!(summary.completion_tokens, want_summary.completion_tokens);
        assert_eq!(summary.prompt_tokens, want_summary.prompt_tokens);
    }
    hangar_backend::Runtime::unload(&*runtime).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_sequence_leaves_and_its_slot_serves_the_next_while_others_continue() {
    let runtime = load(2, 256).await;
    let (want, _) = alone(&runtime, text(PROMPTS[1], 40)).await;
    let (want_next, _) = alone(&runtime, text(PROMPTS[2], 40)).await;
    let cancelled = start(&runtime, text(PROMPTS[0], 200));
    let other = start(&runtime, text(PROMPTS[1], 40));
    until_busy(&runtime, 2).await;
    // The client of the first goes away.
    let Held { task, events } = cancelled;
    drop(events);
    assert_eq!(task.await.expect("task").unwrap_err(), RuntimeError::Cancelled);
    let slots = until_busy(&runtime, 1).await;
    // Every slot's bookkeeping matches llama.cpp's cells (the cancelled one kept its
    // tokens for prompt reuse, nothing beyond them).
    for slot in &slots {
        assert_eq!(slot.cached_tokens, slot.kv_cells, "{slots:?}");
    }
    // The freed slot serves a new sequence while the other still runs.
    let next = start(&runtime, text(PROMPTS[2], 40));
    until_busy(&runtime, 2).await;
    assert_eq!(next.finish().await.0, want_next);
    assert_eq!(other.finish().await.0, want);
    hangar_backend::Runtime::unload(&*runtime).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grammar_constrained_sequence_and_a_free_one_share_a_batch() {
    let runtime = load(2, 512).await;
    let schema = json!({
        "type": "object",
        "properties": { "colour": { "enum": ["red", "green", "blue"] }, "count": { "type": "integer" } },
        "required": ["colour", "count"],
        "additionalProperties": false,
    });
    let structured = || GenerateRequest {
        format: Some(OutputFormat::JsonSchema(schema.clone())),
        ..text("Pick a colour:", 64)
    };
    let (want_free, _) = alone(&runtime, text(PROMPTS[3], 48)).await;
    let (want_json, _) = alone(&runtime, structured()).await;
    let json_held = start(&runtime, structured());
    let free_held = start(&runtime, text(PROMPTS[3], 48));
    until_busy(&runtime, 2).await;
    let (json_text, summary) = json_held.finish().await;
    assert_eq!(free_held.finish().await.0, want_free);
    assert_eq!(json_text, want_json);
    let value: Value = serde_json::from_str(&json_text).unwrap_or_else(|e| {
        panic!("not JSON ({e}; finish {:?}): {json_text}", summary.finish_reason)
    });
    assert!(jsonschema::is_valid(&schema, &value), "{value} does not match {schema}");
    hangar_backend::Runtime::unload(&*runtime).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_that_does_not_fit_is_refused_before_it_takes_a_slot() {
    let runtime = load(2, 64).await;
    let running = start(&runtime, text(PROMPTS[0], 30));
    until_busy(&runtime, 1).await;
    let long = "hangar ".repeat(200);
    let (tx, _rx) = mpsc::channel(16);
    let refused = hangar_backend::Runtime::generate(&*runtime, text(&long, 4), tx).await;
    assert!(
        matches!(&refused, Err(RuntimeError::InvalidRequest { message }) if message.contains("context holds 64")),
        "{refused:?}"
    );
    let slots = runtime.slots().await.expect("slots");
    assert_eq!(slots.iter().filter(|s| s.busy).count(), 1, "{slots:?}");
    let (_, summary) = running.finish().await;
    assert_eq!(summary.completion_tokens, 30);
    hangar_backend::Runtime::unload(&*runtime).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_of_megabytes_is_refused_by_its_length_untokenized_while_the_batch_runs_on() {
    let runtime = load(2, 64).await;
    let running = start(&runtime, text(PROMPTS[0], 30));
    until_busy(&runtime, 1).await;
    // The request body limit's worth of text: its length alone shows it cannot fit 64 tokens.
    let huge = "hangar ".repeat((8 << 20) / 7);
    let (tx, _rx) = mpsc::channel(16);
    let refused = hangar_backend::Runtime::generate(&*runtime, text(&huge, 4), tx).await;
    let Err(RuntimeError::InvalidRequest { message }) = refused else {
        panic!("expected the context's refusal, got {refused:?}");
    };
    // The same refusal as a tokenized prompt's, saying it was counted by length.
    let bytes = format!("({} bytes), the context holds 64", huge.len());
    assert!(message.starts_with("prompt is at least ") && message.ends_with(&bytes), "{message}");
    // The running sequence was not disturbed, and no slot was taken.
    let slots = runtime.slots().await.expect("slots");
    assert_eq!(slots.iter().filter(|s| s.busy).count(), 1, "{slots:?}");
    assert_eq!(running.finish().await.1.completion_tokens, 30);
    hangar_backend::Runtime::unload(&*runtime).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_turn_reuses_the_kv_prefix_a_slot_holds() {
    let runtime = load(2, 512).await;
    let first = "The hangar doors opened and the first aeroplane rolled out";
    let (_, opening) = alone(&runtime, text(first, 8)).await;
    assert_eq!(opening.cached_tokens, 0, "nothing to reuse yet");
    // The same prompt plus more: everything but the last prompt token of the first request
    // is reused (its logits start the answer, so it is decoded again).
    let longer = format!("{first} into the morning light");
    let (reused_text, reused) = alone(&runtime, text(&longer, 8)).await;
    assert!(reused.cached_tokens >= opening.prompt_tokens - 1, "{reused:?} after {opening:?}");
    assert!(reused.cached_tokens < reused.prompt_tokens);
    // Reuse changes nothing in the answer: a fresh replica gives the same tokens.
    let fresh = load(1, 512).await;
    let (fresh_text, cold) = alone(&fresh, text(&longer, 8)).await;
    assert_eq!(cold.cached_tokens, 0);
    assert_eq!(reused_text, fresh_text);
    // An unrelated prompt takes the other (empty) slot and reuses nothing.
    let unrelated = "Zebras graze on the wide plains of the savannah every single morning";
    let (_, unrelated) = alone(&runtime, text(unrelated, 4)).await;
    assert_eq!(unrelated.cached_tokens, 0, "{unrelated:?}");
    // … and leaves the chat's slot alone: its next turn still reuses the prefix.
    let (_, again) = alone(&runtime, text(&longer, 8)).await;
    assert_eq!(again.cached_tokens, again.prompt_tokens - 1, "{again:?}");
    hangar_backend::Runtime::unload(&*runtime).await;
    hangar_backend::Runtime::unload(&*fresh).await;
}
