//! Load progress and the context size.

use super::*;

// 10. Load progress

/// A tiny GGUF loads in milliseconds, too fast to catch llama.cpp's own progress reliably.
/// Loads that share a place are serialized, though (both models here may use any GPU): a
/// llama_cpp model whose load waits behind a slow one is `loading` for as long, and its row
/// shows `load_progress` the whole time.
#[tokio::test]
async fn load_progress_shows_while_loading_and_is_null_otherwise() {
    let models = json!({
        "slow": { "backend": "stub", "device": "gpu", "stub": { "load_delay_ms": 2000 } },
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &[]).await;
    assert_eq!(row(&server, "tiny").await["load_progress"], Value::Null, "unloaded");

    let slow = tokio::spawn({
        let url = server.url("/v1/admin/models/slow/load");
        async move { send(Method::POST, &url, Some(&json!({})), None).await }
    });
    wait_for_row(&server, "slow", "loading", |r| r["runtime_state"] == "loading").await;
    let tiny = tokio::spawn({
        let url = server.url("/v1/admin/models/tiny/load");
        async move { send(Method::POST, &url, Some(&json!({})), None).await }
    });

    // Every value the row shows while loading is a fraction that only grows.
    let mut seen = Vec::new();
    loop {
        let row = row(&server, "tiny").await;
        match row["runtime_state"].as_str() {
            Some("loading") => {
                let p = row["load_progress"].as_f64().unwrap_or_else(|| panic!("{row}"));
                assert!((0.0..=1.0).contains(&p), "{row}");
                seen.push(p);
            }
            Some("loaded") => {
                assert_eq!(row["load_progress"], Value::Null, "{row}");
                break;
            }
            Some("unloaded") => {} // the load request is not there yet
            _ => panic!("{row}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!seen.is_empty(), "the queued load is `loading` with a progress");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    let (status, answer) = tiny.await.unwrap();
    assert_eq!((status, answer["load_progress"].clone()), (200, Value::Null), "{answer}");
    assert_eq!(slow.await.unwrap().0, 200);
    assert_eq!(row(&server, "slow").await["load_progress"], Value::Null);
}

// ---------------------------------------------------------------------------------------
// 11. The context size

/// `gguf_n_ctx` sizes the context, and a prompt that does not fit is refused with 400
/// `invalid_request` naming the context's size. llama.cpp pads the context to a multiple of
/// 256 tokens, so a configured 256 is exact and a configured 64 holds 256 as well.
#[tokio::test]
async fn a_prompt_longer_than_the_context_is_refused_with_400() {
    let models = json!({
        "ctx256": chat_model(json!({ "gguf_n_ctx": 256 })),
        "ctx64": chat_model(json!({ "gguf_n_ctx": 64 })),
    });
    let server = serve(models, &["ctx256", "ctx64"]).await;
    let long = long_prompt(150); // about 320 tokens as chat, 300 as a raw prompt
    for model in ["ctx256", "ctx64"] {
        let requests = [
            ("/v1/chat/completions", chat_body(model, &long, 4)),
            ("/v1/completions", json!({ "model": model, "prompt": long, "max_tokens": 4 })),
            ("/v1/responses", json!({ "model": model, "input": long, "max_output_tokens": 4 })),
        ];
        for (path, request) in requests {
            let (status, answer) = post(&server, path, request).await;
            assert_eq!((status, code(&answer)), (400, "invalid_request"), "{path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("the context holds "), "{path}: {message}");
            if model == "ctx256" {
                assert!(message.ends_with("the context holds 256"), "{path}: {message}");
            }
        }
        // A stream is refused the same way: nothing was generated, so it never starts.
        let request = streaming(chat_body(model, &long, 4), json!({}));
        let (status, answer) = post(&server, "/v1/chat/completions", request).await;
        assert_eq!((status, code(&answer)), (400, "invalid_request"), "{answer}");
        // The refusal is the request's, not the model's.
        assert_eq!(row(&server, model).await["runtime_state"], "loaded");
        chat_ok(&server, model, "hello", 2).await;
    }

    // Generation that runs out of context ends with `length` at the context's end.
    let prompt = running_prompt(&server, "ctx256", 1000).await;
    let (status, body) =
        post(&server, "/v1/chat/completions", chat_body("ctx256", &prompt, 1000)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() < 1000, "{body}");
    assert_eq!(body["usage"]["total_tokens"], 256, "{body}");
}

/// llama.cpp refuses a quantized V cache without flash attention. The combination is
/// knowable from the load body alone, so validation refuses it (400) — before, the load
/// failed in llama.cpp (500 `load_failed`) and the manager evicted every other loaded model
/// to retry a load that could not succeed.
#[tokio::test]
async fn a_quantized_v_cache_without_flash_attention_is_refused_before_loading() {
    let models = json!({
        "embed": gguf("tiny-embed.gguf", json!({ "labels": ["embedding"] })),
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &["embed"]).await;
    let body = json!({ "gguf_type_v": "q8_0", "gguf_flash_attn": "off" });
    let (status, answer) = load(&server, "tiny", body).await;
    assert_eq!(row(&server, "embed").await["runtime_state"], "loaded", "nothing evicted");
    assert_eq!((status, code(&answer)), (400, "invalid_load_request"), "{answer}");
}
