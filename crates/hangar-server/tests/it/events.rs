//! `GET /v1/admin/events` in-process: state changes, load progress, evictions and crashes
//! as numbered server-sent events, resumed with `Last-Event-ID` without a loss or a repeat,
//! and a resync notice when the asked-for events are gone.

use bytes::Bytes;
use hangar_server::HangarService;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::support::{Sse, call, request, server};

fn service() -> HangarService {
    server()
        .settings(json!({ "max_loaded_models": { "llm": 1 } }))
        .models(json!({
            "a": { "backend": "stub", "stub": { "load_delay_ms": 20 } },
            "b": { "backend": "stub" },
            "fragile": { "type": "embedding", "backend": "stub", "stub": { "crash_after_requests": 1 } }
        }))
        .build()
}

/// An open event stream, read event by event.
struct Events(Sse);

impl Events {
    async fn open(s: &HangarService, last_event_id: Option<&str>) -> Self {
        let mut call = request(Method::GET, "/v1/admin/events");
        if let Some(id) = last_event_id {
            call = call.header("last-event-id", id);
        }
        Self(Sse::of(call.respond(s).await))
    }

    /// The next event: its id (if any) and its data.
    async fn next(&mut self) -> (Option<String>, Value) {
        let event = self.0.next().await.expect("the stream is open");
        (event.id.clone(), event.json())
    }

    /// Events up to and including the first for which `last` holds.
    async fn until(&mut self, last: impl Fn(&Value) -> bool) -> Vec<(Option<String>, Value)> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await;
            let done = last(&event.1);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

fn is_state(event: &Value, model: &str, to: &str) -> bool {
    event["type"] == "state" && event["model"] == model && event["to"] == to
}

#[tokio::test]
async fn loads_evictions_and_crashes_arrive_in_order_with_increasing_ids() {
    let s = service();
    let mut events = Events::open(&s, None).await;
    assert_eq!(call(&s, Method::POST, "/v1/admin/models/a/load", json!({})).await.0, 200);
    let seen = events.until(|e| is_state(e, "a", "loaded")).await;
    let first = &seen[0].1;
    assert_eq!(
        (&first["from"], &first["to"], &first["cause"]),
        (&json!("unloaded"), &json!("loading"), &json!("start_load"))
    );
    assert!(seen.iter().any(|(_, e)| e["type"] == "load_progress" && e["progress"] == 1.0));
    let ids: Vec<u64> = seen
        .iter()
        .map(|(id, _)| id.as_deref().unwrap().split_once('-').unwrap().1.parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");

    // b needs a's slot: a is evicted, and the event says why and for whom.
    assert_eq!(call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await.0, 200);
    let seen = events.until(|e| is_state(e, "b", "loaded")).await;
    let evicted = seen.iter().find(|(_, e)| e["type"] == "evicted").expect("an eviction event");
    assert_eq!(
        (&evicted.1["model"], &evicted.1["reason"], &evicted.1["for_model"]),
        (&json!("a"), &json!("slot_limit"), &json!("b"))
    );
    assert!(seen.iter().any(|(_, e)| is_state(e, "a", "unloaded")));

    // A crash is a transition to failed with the cause and the error.
    assert_eq!(call(&s, Method::POST, "/v1/admin/models/fragile/load", json!({})).await.0, 200);
    let embed = json!({ "model": "fragile", "input": "x" });
    call(&s, Method::POST, "/v1/embeddings", embed).await;
    let seen = events.until(|e| is_state(e, "fragile", "failed")).await;
    let crash = &seen.last().unwrap().1;
    assert_eq!(crash["cause"], "crashed");
    assert!(crash["error"].as_str().unwrap().contains("crash"), "{crash}");
}

#[tokio::test]
async fn a_client_that_reconnects_with_its_last_id_misses_and_repeats_nothing() {
    let s = service();
    let mut events = Events::open(&s, None).await;
    call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await;
    let seen = events.until(|e| is_state(e, "b", "loaded")).await;
    let last_id = seen.last().unwrap().0.clone().unwrap();
    drop(events);

    // Changes while disconnected.
    call(&s, Method::POST, "/v1/admin/models/b/unload", json!({})).await;
    let mut resumed = Events::open(&s, Some(&last_id)).await;
    let (id, first) = resumed.next().await;
    assert!(is_state(&first, "b", "unloading"), "{first}");
    let (epoch, n) = last_id.split_once('-').unwrap();
    let n: u64 = n.parse().unwrap();
    assert_eq!(id.unwrap(), format!("{epoch}-{}", n + 1), "the next id, nothing repeated");
    assert!(is_state(&resumed.next().await.1, "b", "unloaded"));

    // The query parameter does the same (for clients that cannot set headers).
    let path = format!("/v1/admin/events?last_event_id={last_id}");
    let mut by_query = Events(Sse::of(request(Method::GET, &path).respond(&s).await));
    assert!(is_state(&by_query.next().await.1, "b", "unloading"));
}

#[tokio::test]
async fn ids_of_another_server_run_get_a_resync_first_and_bad_ids_a_400() {
    let s = service();
    call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await;
    // An id from before a restart (another epoch): resync, then every kept event.
    let mut events = Events::open(&s, Some("1-5")).await;
    let (id, resync) = events.next().await;
    assert_eq!((id, &resync["type"]), (None, &json!("resync")));
    assert!(resync["message"].as_str().unwrap().contains("/v1/admin/models"));
    let (_, first) = events.next().await;
    assert!(is_state(&first, "b", "loading"), "{first}");

    let (status, body) =
        call(&s, Method::GET, "/v1/admin/events?last_event_id=yesterday", json!(null)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
    // The largest id the document's pattern allows is well-formed: another epoch, a resync.
    let mut largest = Events::open(&s, Some("9999999999999999999-9999999999999999999")).await;
    assert_eq!(largest.next().await.1["type"], "resync");
}

#[tokio::test]
async fn a_slow_reader_falls_behind_the_live_feed_and_still_gets_every_event_once() {
    let s = service();
    let mut events = Events::open(&s, None).await;
    // Hundreds of events while nobody reads: more than the live feed and the response
    // buffer hold together, fewer than the journal keeps.
    for _ in 0..80 {
        call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await;
        call(&s, Method::POST, "/v1/admin/models/b/unload", json!({})).await;
    }
    let mut ids = Vec::new();
    let mut unloads = 0;
    while unloads < 80 {
        let (id, event) = events.next().await;
        assert_ne!(event["type"], "resync", "nothing was lost");
        ids.push(id.unwrap().split_once('-').unwrap().1.parse::<u64>().unwrap());
        unloads += usize::from(is_state(&event, "b", "unloaded"));
    }
    assert!(ids.len() > 320, "{} events", ids.len());
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "consecutive ids: {ids:?}");
}

#[tokio::test]
async fn last_event_ids_at_the_edge_of_u64_resync_and_ids_that_are_not_text_answer_400() {
    let s = service();
    let mut events = Events::open(&s, None).await;
    call(&s, Method::POST, "/v1/admin/models/b/load", json!({})).await;
    let seen = events.until(|e| is_state(e, "b", "loaded")).await;
    let (epoch, _) = seen[0].0.as_deref().unwrap().split_once('-').unwrap();
    // This server's epoch with the largest id there is: from the future, so a resync (the
    // journal once added 1 to it).
    let mut future = Events::open(&s, Some(&format!("{epoch}-{}", u64::MAX))).await;
    assert_eq!(future.next().await.1["type"], "resync");
    // A header that is not text is a bad id, not a missing one.
    let not_text = http::HeaderValue::from_bytes(b"7-\xff").unwrap();
    let req = Request::builder().uri("/v1/admin/events").header("last-event-id", not_text);
    let resp = s.handle(req.body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(resp.status(), 400);
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
}
