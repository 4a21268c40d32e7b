//! Weight control on the real in-process llama.cpp engine (`hangard serve` on the tiny GGUF
//! fixture, over HTTP): a retract pause in the middle of a streamed answer, weight updates
//! that change what the model says (and one that fails and changes nothing), and the
//! weights checker noticing one changed tensor byte. The weights are random: the tests
//! compare greedy answers with each other, never with fixed text.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Server, Sse, get, load, post, temp_dir};

fn fixture() -> PathBuf {
    let path = format!("{}/../../fixtures/models/tiny-llama.gguf", env!("CARGO_MANIFEST_DIR"));
    std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn serve() -> Server {
    let model = json!({ "backend": "llama_cpp", "model_path": fixture(), "prompt_format": "auto" });
    let server = Server::start(&json!({ "models": { "tiny": model } }), &[]);
    let (status, row) = load(&server, "tiny", json!({})).await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
    server
}

async fn row(server: &Server) -> Value {
    let (status, row) = get(server, "/v1/admin/models/tiny").await;
    assert_eq!(status, 200);
    row
}

fn chat(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "model": "tiny",
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The greedy answer to `prompt`.
async fn answer(server: &Server, prompt: &str, max_tokens: u32) -> String {
    let (status, body) = post(server, "/v1/chat/completions", chat(prompt, max_tokens)).await;
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
}

/// A copy of the fixture in a fresh directory, with `edit` applied to its bytes.
fn copy_with(label: &str, edit: impl FnOnce(&Path, &mut Vec<u8>)) -> PathBuf {
    let path = temp_dir(label).join("tiny-llama.gguf");
    let mut bytes = std::fs::read(fixture()).unwrap();
    edit(&fixture(), &mut bytes);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The byte range of `tensor` in the GGUF at `path`.
fn tensor_range(path: &Path, tensor: &str) -> std::ops::Range<usize> {
    let located = hangar_weights::locate_tensors(path).unwrap();
    let found = located.iter().find(|t| t.name == tensor).unwrap_or_else(|| panic!("{tensor}"));
    found.range.start as usize..found.range.end as usize
}

/// A prompt whose greedy answer runs to `max_tokens` (several hundred ms of decoding).
async fn running_prompt(server: &Server, max_tokens: u32) -> String {
    let candidates = (0..30).map(|i| format!("item {i}"));
    for prompt in std::iter::once("Tell me about hangars.".to_owned()).chain(candidates) {
        let (status, body) = post(server, "/v1/chat/completions", chat(&prompt, max_tokens)).await;
        assert_eq!(status, 200, "{body}");
        if body["choices"][0]["finish_reason"] == "length" {
            return prompt;
        }
    }
    panic!("no candidate prompt runs to {max_tokens} tokens");
}

#[tokio::test]
async fn a_retract_pause_mid_answer_resumes_the_same_stream_after_continue() {
    let server = serve().await;
    let max_tokens = 400;
    let prompt = running_prompt(&server, max_tokens).await;
    let mut body = chat(&prompt, max_tokens);
    body["stream"] = true.into();
    body["stream_options"] = json!({ "include_usage": true });
    let mut sse = Sse::start(&server, "/v1/chat/completions", &body).await;
    let mut text = String::new();
    while text.is_empty() {
        let chunk = sse.next().await.expect("content before the end").json();
        text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    let (status, paused) =
        post(&server, "/v1/admin/models/tiny/pause", json!({ "mode": "retract" })).await;
    assert_eq!((status, paused["pause"]["mode"].as_str()), (200, Some("retract")), "{paused}");
    let mut retracted = false;
    for _ in 0..200 {
        let r = row(&server).await;
        if r["runtime_inflight"] == 0 && r["queue_depth"] == 1 {
            retracted = true;
            break;
        }
        if r["runtime_inflight"] == 0 && r["queue_depth"] == 0 {
            break; // it finished before the pause reached it
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(retracted, "the running generation went back to the queue: {}", row(&server).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = post(&server, "/v1/admin/models/tiny/continue", json!({})).await;
    assert_eq!(status, 200);

    let mut finish = None;
    let mut usage = Value::Null;
    while let Some(event) = sse.next().await {
        if event.data == "[DONE]" {
            break;
        }
        let chunk = event.json();
        assert!(chunk.get("error").is_none(), "{chunk}");
        if let Some(choice) = chunk["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_owned());
            }
        }
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
    }
    // One answer: it ran on to its limit, counted once, after the text sent before.
    assert!(!text.is_empty());
    // The resumed run may tokenize the text sent so far differently and then pick other
    // tokens, so it may end by itself; it never runs past max_tokens.
    match finish.as_deref() {
        Some("length") => assert_eq!(usage["completion_tokens"], max_tokens, "{usage}"),
        Some("stop") => assert!(usage["completion_tokens"].as_u64() <= Some(max_tokens.into())),
        other => panic!("finish reason {other:?}: {usage}"),
    }
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens < 64, "the resumed text is not counted as prompt: {usage}");
}

#[tokio::test]
async fn weight_updates_swap_what_the_model_runs_and_a_failed_one_changes_nothing() {
    let server = serve().await;
    let prompt = "Tell me about hangars.";
    let original = answer(&server, prompt, 24).await;
    // Weights that answer differently: the final norm zeroed makes every logit equal.
    let changed = copy_with("weights-zero-norm", |path, bytes| {
        bytes[tensor_range(path, "output_norm.weight")].fill(0);
    });
    let update = json!({ "model_path": changed, "weight_version": "step-1" });
    let (status, row_after) =
        post(&server, "/v1/admin/models/tiny/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{row_after}");
    assert_eq!(row_after["weights_path"], changed.to_str().unwrap());
    assert_eq!(
        (row_after["weight_version"].as_str(), &row_after["pause"]),
        (Some("step-1"), &Value::Null)
    );
    let after = answer(&server, prompt, 24).await;
    assert_ne!(after, original, "the new weights answer");

    // A path that does not exist: 400 load_failed, the step-1 weights keep serving.
    let bad = json!({ "model_path": "/nonexistent/weights.gguf", "weight_version": "step-2" });
    let (status, body) = post(&server, "/v1/admin/models/tiny/update-weights-from-disk", bad).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("load_failed")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("keep serving"), "{body}");
    let r = row(&server).await;
    assert_eq!((r["weight_version"].as_str(), &r["pause"]), (Some("step-1"), &Value::Null), "{r}");
    assert_eq!(answer(&server, prompt, 24).await, after, "the previous weights still answer");

    // SGLang's path, no model_path: the configured weights again.
    let (status, body) =
        post(&server, "/update_weights_from_disk", json!({ "weight_version": "base" })).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(answer(&server, prompt, 24).await, original);
    let (_, info) = get(&server, "/model_info").await;
    assert_eq!(
        (info["weight_version"].as_str(), info["model_path"].as_str()),
        (Some("base"), fixture().to_str())
    );
}

#[tokio::test]
async fn the_checksum_changes_with_one_tensor_byte_and_compare_names_that_tensor() {
    let server = serve().await;
    let copy = copy_with("weights-checksum", |_, _| {});
    let update = json!({ "model_path": copy });
    let (status, body) =
        post(&server, "/v1/admin/models/tiny/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{body}");

    let checker = "/v1/admin/models/tiny/weights-checker";
    let (status, snap) = post(&server, checker, json!({ "action": "snapshot" })).await;
    assert_eq!(status, 200, "{snap}");
    let tensors = snap["digest"]["tensors"].as_array().unwrap();
    assert!(tensors.len() > 5, "{snap}");
    assert!(tensors.iter().all(|t| t["sha256"].as_str().is_some_and(|h| h.len() == 64)));
    assert_eq!(snap["digest"]["format"], "gguf");
    let (_, unchanged) = post(&server, checker, json!({ "action": "compare" })).await;
    assert_eq!(unchanged["comparison"]["identical"], true, "{unchanged}");

    // One byte of one tensor, changed on disk.
    let range = tensor_range(&copy, "blk.0.attn_q.weight");
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[range.start + 5] ^= 0x40;
    std::fs::write(&copy, bytes).unwrap();
    let (status, compared) = post(&server, checker, json!({ "action": "compare" })).await;
    assert_eq!(status, 200, "{compared}");
    assert_eq!(compared["comparison"]["changed"], json!(["blk.0.attn_q.weight"]), "{compared}");
    assert_eq!(compared["comparison"]["identical"], false);
    assert_ne!(compared["digest"]["checksum"], snap["digest"]["checksum"]);
    // SGLang's GET form changes nothing: a checksum would pause the serving model, so it
    // is refused; once an operator has paused the model, the GET reads the same digest.
    let (status, refused) = get(&server, "/weights_checker?action=checksum").await;
    assert_eq!((status, refused["error"]["code"].as_str()), (405, Some("would_pause")));
    assert_eq!(row(&server).await["pause"], Value::Null, "the refused GET paused nothing");
    let pause = json!({ "mode": "in_place" });
    assert_eq!(post(&server, "/v1/admin/models/tiny/pause", pause).await.0, 200);
    let (status, sglang) = get(&server, "/weights_checker?action=checksum").await;
    assert_eq!((status, sglang["success"].as_bool()), (200, Some(true)), "{sglang}");
    assert_eq!(sglang["digest"]["checksum"], compared["digest"]["checksum"]);
    assert_eq!(post(&server, "/v1/admin/models/tiny/continue", json!({})).await.0, 200);
    // The model is not left paused.
    assert_eq!(row(&server).await["pause"], Value::Null);
    let (status, body) = post(&server, checker, json!({ "action": "reset_tensors" })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (501, Some("not_implemented")));
}
