//! Requests beyond a child's target queue in Hangar, and a swap under concurrent requests
//! loses none.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_child_is_handed_two_requests_beyond_its_target_and_the_rest_queue_in_hangar() {
    let models = json!({ "chat": chat_model(json!({ "target_inflight": 1 })) });
    let server = Server::start(&config(models), &[]);
    load_ok(&server, "chat", json!({})).await;
    let loaded = row(&server, "chat").await;
    let details = &loaded["runtime_details"][0];
    assert!(details["command"].as_str().unwrap().contains("--parallel 1"), "{loaded}");
    assert_eq!(details["dispatch_ahead"], 2, "{loaded}");
    assert_eq!(loaded["effective_target_inflight"], 1, "{loaded}");

    // Five chats of 1,900 tokens (the 2,048-token context holds the prompt and those), one
    // at a time: while the engine runs the first (0.2-2 s, by the host's load), the row must
    // show three at the engine and two queued.
    const TOKENS: u32 = 1900;
    let chats: Vec<_> = (0..5)
        .map(|_| {
            let url = server.url("/v1/chat/completions");
            tokio::spawn(async move {
                send(Method::POST, &url, Some(&chat_body("chat", TOKENS)), None).await
            })
        })
        .collect();
    let busy = wait_for_row(&server, "chat", "3 at the engine, 2 in Hangar's queue", |r| {
        r["runtime_inflight"] == 3 && r["queue_depth"] == 2
    })
    .await;
    assert_eq!(busy["inflight_requests"], 5, "{busy}");
    for chat in chats {
        let (status, body) = chat.await.unwrap();
        assert_eq!(status, 200, "{body}");
        check_chat(&body, "chat", TOKENS);
    }
    let idle = row(&server, "chat").await;
    assert_eq!(
        (idle["runtime_inflight"].as_u64(), idle["queue_depth"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_swap_under_concurrent_requests_loses_none() {
    let settings = json!({
        "max_loaded_models": { "llm": 1 },
        "auto_load": true,
        "models": { "a": chat_model(json!({})), "b": chat_model(json!({})) },
    });
    let server = Server::start(&settings, &[]);
    const CLIENTS: usize = 4;
    const EACH: usize = 6;
    const ALLOWED: [&str; 4] =
        ["model_unloading", "model_loading", "queue_full", "model_not_loaded"];
    let url = server.url("/v1/chat/completions");
    let clients = (0..CLIENTS).map(|client| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..EACH {
                let model = if (client + i) % 2 == 0 { "a" } else { "b" };
                let (status, body) =
                    send(Method::POST, &url, Some(&chat_body(model, 16)), None).await;
                answers.push((model, status, body));
            }
            answers
        })
    });
    let clients: Vec<_> = clients.collect();
    // Meanwhile, hangard's llama-server children are counted.
    let hangard = server.pid();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let counting = tokio::spawn(async move {
        let mut most = 0;
        let mut stopped = stopped;
        loop {
            most = most.max(llama_server_children(hangard).len());
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = &mut stopped => return most,
            }
        }
    });
    let answers = tokio::time::timeout(Duration::from_secs(120), async {
        let mut all = Vec::new();
        for client in clients {
            all.extend(client.await.expect("a client task"));
        }
        all
    })
    .await
    .expect("every request answers within 120 s");

    let mut tally: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for (model, status, body) in &answers {
        if *status == 200 {
            check_chat(body, model, 16);
            *tally.entry((model, "200".to_owned())).or_default() += 1;
        } else {
            assert!(!(200..300).contains(status), "{status}: {body}");
            let code = code(body);
            assert!(ALLOWED.contains(&code), "{model}: {status} {body}");
            *tally.entry((model, code.to_owned())).or_default() += 1;
        }
    }
    assert_eq!(answers.len(), CLIENTS * EACH);
    for model in ["a", "b"] {
        assert!(tally.contains_key(&(model, "200".to_owned())), "no 200 for {model}: {tally:?}");
    }
    let _ = stop.send(());
    let most_children = counting.await.unwrap();
    // The models took turns: each load of one evicted the other.
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().expect("metrics text");
    let evictions: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("hangar_model_evictions_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no eviction count: {metrics}"));
    eprintln!("answers: {tally:?}; evictions: {evictions}; most children at once: {most_children}");
    assert!(evictions >= 1, "a swap happened: {tally:?}");
    let children = llama_server_children(server.pid());
    assert!(children.len() <= 1, "llama-server children alive: {children:?}");
    assert!(most_children <= 1, "{most_children} llama-server children ran at once");
}
