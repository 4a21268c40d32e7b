//! `GET /metrics/node` read as the Gateway API Inference Extension's endpoint picker reads a
//! vLLM pod (its `pkg/epp/backend/metrics` rules, reproduced here: the picker is Go and
//! cannot be fetched on these machines): one series per name, the first one taken; of
//! `vllm:lora_requests_info` the series with a running or waiting list and the largest
//! value; adapter lists split on commas; `max_lora` an integer. With models loaded, loading
//! and requests queued.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hangar_server::HangarService;
use http::Method;
use serde_json::json;

use crate::support::{call, request, server};

/// One sample: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// The exposition's samples by metric name, in order (the text format's grammar for
/// unescaped, comma-free label values and plain numbers, which is all the picker needs).
fn families(text: &str) -> BTreeMap<String, Vec<Sample>> {
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("a value");
        let value: f64 = value.parse().expect("a number");
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closed labels");
                let labels = body
                    .split("\",")
                    .map(|pair| {
                        let (k, v) = pair.split_once("=\"").expect("k=\"v\"");
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (name, labels)
            }
        };
        out.entry(name.to_owned()).or_default().push((labels, value));
    }
    out
}

/// What the picker keeps of a scrape.
#[derive(Debug, PartialEq)]
struct Picked {
    waiting_queue: f64,
    running: f64,
    kv_usage: f64,
    active: BTreeSet<String>,
    waiting_models: BTreeSet<String>,
    max_active: i64,
}

fn pick(text: &str) -> Picked {
    let families = families(text);
    for (name, samples) in &families {
        assert_eq!(samples.len(), 1, "{name}: one series per name, else the picker drops some");
    }
    let first = |name: &str| families[name][0].1;
    let lora = families["vllm:lora_requests_info"]
        .iter()
        .filter(|(l, _)| {
            !l["running_lora_adapters"].is_empty() || !l["waiting_lora_adapters"].is_empty()
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a lora series with a list");
    let split =
        |key: &str| lora.0[key].split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    Picked {
        waiting_queue: first("vllm:num_requests_waiting"),
        running: first("vllm:num_requests_running"),
        kv_usage: first("vllm:kv_cache_usage_perc"),
        active: split("running_lora_adapters"),
        waiting_models: split("waiting_lora_adapters"),
        max_active: lora.0["max_lora"].parse().expect("max_lora is an integer"),
    }
}

fn service() -> HangarService {
    let slow = |ms: u64| json!({ "token_latency_ms": ms, "load_delay_ms": 5 });
    server()
        .settings(json!({ "max_loaded_models": { "llm": 3 } }))
        .models(json!({
            "busy": { "backend": "stub", "aliases": ["publishers/x/models/busy"],
                      "target_inflight": 1, "stub": slow(30) },
            "idle": { "backend": "stub", "replicas": 2, "target_inflight": 2, "stub": slow(1) },
            "coming": { "backend": "stub", "stub": { "load_delay_ms": 60_000 } },
            "off": { "backend": "stub" },
        }))
        .build()
}

async fn scrape(s: &HangarService) -> String {
    let answer = request(Method::GET, "/metrics/node").send(s).await;
    assert_eq!(answer.status, 200);
    assert!(answer.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    answer.text()
}

#[tokio::test]
async fn the_picker_reads_the_models_served_loading_and_queued() {
    let s = service();
    // Nothing loaded: no list, so the picker keeps no series of the lora family.
    let idle_node = families(&scrape(&s).await);
    assert_eq!(idle_node["vllm:num_requests_running"][0].1, 0.0);
    assert_eq!(idle_node["vllm:kv_cache_usage_perc"][0].1, 0.0);
    for name in ["busy", "idle"] {
        let path = format!("/v1/admin/models/{name}/load");
        assert_eq!(call(&s, Method::POST, &path, json!({})).await.0, 200);
    }
    let coming = tokio::spawn({
        let s = s.clone();
        async move { call(&s, Method::POST, "/v1/admin/models/coming/load", json!({})).await }
    });
    // Three requests on busy (one slot): one runs, two wait.
    let body = json!({ "model": "busy", "max_tokens": 20,
        "messages": [{ "role": "user", "content": "hi" }] });
    let requests: Vec<_> = (0..3)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            tokio::spawn(async move { call(&s, Method::POST, "/v1/chat/completions", body).await })
        })
        .collect();
    loop {
        let (_, busy) = call(&s, Method::GET, "/v1/admin/models/busy", "").await;
        let (_, coming) = call(&s, Method::GET, "/v1/admin/models/coming", "").await;
        if busy["inflight_requests"] == 3 && coming["runtime_state"] == "loading" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(
        pick(&scrape(&s).await),
        Picked {
            waiting_queue: 2.0,
            running: 1.0,
            // One of busy's slot and idle's four (2 replicas × 2) in use.
            kv_usage: 0.2,
            active: names(&["busy", "publishers/x/models/busy", "idle"]),
            waiting_models: names(&["coming"]),
            max_active: 3,
        }
    );
    for r in requests {
        assert_eq!(r.await.unwrap().0, 200);
    }
    coming.abort();
}

#[tokio::test]
async fn it_takes_the_metrics_key_as_metrics_does() {
    let s = server()
        .settings(json!({ "http": { "metrics_require_key": true } }))
        .models(json!({ "m": { "backend": "stub" } }))
        .inference_keys(&["ik"])
        .build();
    assert_eq!(request(Method::GET, "/metrics/node").send(&s).await.status, 401);
    assert_eq!(request(Method::GET, "/metrics/node").bearer("ik").send(&s).await.status, 200);
}
