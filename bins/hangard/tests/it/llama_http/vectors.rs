//! Embeddings and reranking over HTTP.

use super::*;

// 4-5. Embeddings and reranking

#[tokio::test]
async fn embeddings_are_normalized_deterministic_and_base64_decodes_to_the_floats() {
    let models = json!({
        "embed": gguf("tiny-embed.gguf", json!({ "labels": ["embedding"] })),
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &["embed", "tiny"]).await;
    let inputs = ["a hangar full of planes", "the quick brown fox", "a hangar full of planes"];
    let (status, body) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": inputs })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["object"].as_str(), body["model"].as_str()), (Some("list"), Some("embed")));
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(body["usage"]["total_tokens"], body["usage"]["prompt_tokens"]);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "{body}");
    let vectors: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(
                (item["object"].as_str(), item["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            let v: Vec<f32> = item["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-3, "input {i}: |v| = {norm}");
            v
        })
        .collect();
    assert!(!vectors[0].is_empty());
    assert!(vectors.iter().all(|v| v.len() == vectors[0].len()), "one dimension");
    assert_eq!(vectors[0], vectors[2], "identical inputs, identical vectors");
    assert_ne!(vectors[0], vectors[1], "different inputs, different vectors");

    // One input alone gives the vector it got in the batch.
    let (status, single) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": inputs[1] })).await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(single["data"][0]["embedding"], data[1]["embedding"]);

    // base64: little-endian f32 bytes of the same floats.
    let request = json!({ "model": "embed", "input": inputs, "encoding_format": "base64" });
    let (status, encoded) = post(&server, "/v1/embeddings", request).await;
    assert_eq!(status, 200, "{encoded}");
    for (i, item) in encoded["data"].as_array().unwrap().iter().enumerate() {
        let bytes = base64_decode(item["embedding"].as_str().unwrap());
        assert_eq!(bytes.len(), vectors[i].len() * 4);
        let floats: Vec<f32> =
            bytes.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(floats, vectors[i], "input {i}: base64 vs float");
    }

    // Each model does its own job only: refused by type before reaching the engine.
    let (status, refused) =
        post(&server, "/v1/embeddings", json!({ "model": "tiny", "input": "x" })).await;
    assert_eq!((status, code(&refused)), (400, "model_type_mismatch"), "{refused}");
    let (status, refused) =
        post(&server, "/v1/chat/completions", chat_body("embed", "hello", 2)).await;
    assert_eq!((status, code(&refused)), (400, "model_type_mismatch"), "{refused}");
    assert_eq!(row(&server, "embed").await["runtime_state"], "loaded", "a refusal is no crash");
}

#[tokio::test]
async fn rerank_orders_every_document_by_score() {
    let models = json!({ "rerank": gguf("tiny-rerank.gguf", json!({ "labels": ["reranking"] })) });
    let server = serve(models, &["rerank"]).await;
    let documents = json!([
        "a fox is an animal",
        { "text": "paris is in france" },
        "x",
        "foxes live in dens",
        { "text": "planes are kept in hangars" }
    ]);
    let text = |i: usize| {
        let d = &documents[i];
        d.as_str().or(d["text"].as_str()).unwrap().to_owned()
    };
    let request = json!({ "model": "rerank", "query": "what is a fox", "documents": documents });
    let (status, full) = post(&server, "/v1/rerank", request.clone()).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["model"], "rerank");
    assert!(full["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{full}");
    let results = full["results"].as_array().unwrap();
    let mut indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert!(scores.iter().all(|s| s.is_finite()), "{full}");
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "sorted by score, best first: {full}");
    assert!(results.iter().all(|r| r.get("document").is_none()), "no documents unasked");
    indices.sort_unstable();
    assert_eq!(indices, [0, 1, 2, 3, 4], "every document once: {full}");

    let (status, again) = post(&server, "/v1/rerank", request.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(again["results"], full["results"], "deterministic");

    let mut top = request;
    top["top_n"] = 2.into();
    top["return_documents"] = true.into();
    let (status, top) = post(&server, "/v1/rerank", top).await;
    assert_eq!(status, 200, "{top}");
    let best = top["results"].as_array().unwrap();
    assert_eq!(best.len(), 2, "top_n truncates: {top}");
    for (got, want) in best.iter().zip(results) {
        assert_eq!(got["index"], want["index"], "the best of the full ranking");
        assert_eq!(got["relevance_score"], want["relevance_score"]);
        let index = got["index"].as_u64().unwrap() as usize;
        assert_eq!(got["document"]["text"], text(index), "{got}");
    }
}
