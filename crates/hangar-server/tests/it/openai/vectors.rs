//! Embeddings and rerank.

use super::*;

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        bits = (bits << 6) | ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn embeddings_one_normalized_vector_per_input() {
    let svc = service().await;
    let inputs = ["the first text", "second", "the first text"];
    let (status, body) =
        post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": inputs })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "embed");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vectors: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(
                (d["object"].as_str(), d["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        })
        .collect();
    for v in &vectors {
        assert_eq!(v.len(), EMBEDDING_DIM);
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not normalized: {norm}");
    }
    assert_eq!(vectors[0], vectors[2], "equal inputs embed equally");
    assert_ne!(vectors[0], vectors[1]);
    assert_eq!(body["usage"], json!({ "prompt_tokens": 7, "total_tokens": 7 }));

    let (_, single) =
        post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": "second" })).await;
    assert_eq!(single["data"].as_array().unwrap().len(), 1);
    assert_eq!(single["data"][0]["embedding"], data[1]["embedding"]);

    let (status, encoded) = post(
        &svc,
        "/v1/embeddings",
        json!({ "model": "embed", "input": "second", "encoding_format": "base64" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{encoded}");
    let bytes = base64_decode(encoded["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f32> =
        bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, vectors[1]);

    for input in [json!([1, 2, 3]), json!([[1, 2]]), json!([])] {
        let got = post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": input })).await;
        assert_error(&got, 400, "invalid_request");
    }
    let got = post(&svc, "/v1/embeddings", json!({ "model": "chat", "input": "x" })).await;
    assert_error(&got, 400, "model_type_mismatch");
}

#[tokio::test(start_paused = true)]
async fn rerank_sorts_by_score_with_original_indices() {
    let svc = service().await;
    let documents = ["banana bread", "a red apple pie", "apple juice", "red car", "green apple"];
    let (status, body) = post(
        &svc,
        "/v1/rerank",
        json!({ "model": "rerank", "query": "red apple", "documents": documents }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "rerank");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), documents.len());
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "sorted descending: {scores:?}");
    let mut indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indices[0], 1, "the document with both query words wins");
    assert_eq!(*indices.last().unwrap(), 0, "the document with no query word loses");
    assert!(results.iter().all(|r| r.get("document").is_none()));
    indices.sort();
    assert_eq!(indices, [0, 1, 2, 3, 4]);
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let (_, top) = post(
        &svc,
        "/v1/rerank",
        json!({ "model": "rerank", "query": "red apple", "documents": documents, "top_n": 2, "return_documents": true }),
    )
    .await;
    let top = top["results"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(
        top[0],
        json!({ "index": 1, "relevance_score": scores[0], "document": { "text": "a red apple pie" } })
    );
    assert_eq!(top[1]["index"], results[1]["index"]);

    let got =
        post(&svc, "/v1/rerank", json!({ "model": "rerank", "query": "q", "documents": [] })).await;
    assert_error(&got, 400, "invalid_request");
    let got = post(&svc, "/v1/rerank", json!({ "model": "rerank", "documents": ["d"] })).await;
    assert_error(&got, 400, "invalid_request");
}
