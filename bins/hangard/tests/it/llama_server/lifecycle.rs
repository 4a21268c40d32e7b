//! A child's life through the admin API: load, chat, stream, embed, unload; load overrides
//! in its argv; a weight update that swaps it.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn load_chat_stream_embed_and_unload_end_the_child() {
    let models = json!({ "chat": chat_model(json!({})), "embed": embed_model() });
    let server = Server::start(&config(models), &[]);
    let chat_pid = load_ok(&server, "chat", json!({})).await;
    let embed_pid = load_ok(&server, "embed", json!({})).await;
    assert_ne!(chat_pid, embed_pid);
    for pid in [chat_pid, embed_pid] {
        let (_, ppid, comm) = proc_stat(pid).expect("the child runs");
        assert_eq!((ppid, comm.as_str()), (server.pid(), "llama-server"), "a child of hangard");
    }
    let shown = row(&server, "embed").await;
    let command = shown["runtime_details"][0]["command"].as_str().unwrap();
    assert!(command.contains(" --embedding"), "{shown}");
    assert!(
        shown["runtime_details"][0]["backend_url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{shown}"
    );

    // A whole answer: ignore_eos makes it run to max_tokens.
    chat_ok(&server, "chat", 12).await;

    // A stream: role, content, finish, [DONE].
    let mut request = chat_body("chat", 12);
    request["stream"] = true.into();
    let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
    let content = check_chat_stream(&events, "chat");
    assert!(content > 0, "content chunks: {events:?}");

    // Engine output is in hangard's log (INFO) until the engine listens; the per-request
    // lines after that are DEBUG there, and every line stays in the model's log.
    let kept = log_lines(&server, "chat").await;
    assert!(kept.iter().any(|l| text(l).contains("print_timing")), "{kept:?}");
    let logged = server.logs();
    assert!(logged.contains("listening on"), "{logged}");
    assert!(!logged.contains("print_timing"), "{logged}");

    // Two inputs, two vectors of one length.
    let (status, body) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": ["hello", "world"] }))
            .await;
    assert_eq!(status, 200, "{body}");
    let data = body["data"].as_array().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(data.len(), 2, "{body}");
    let lengths: Vec<usize> =
        data.iter().map(|d| d["embedding"].as_array().map_or(0, Vec::len)).collect();
    assert!(lengths[0] > 0 && lengths[0] == lengths[1], "{lengths:?}");

    // Unload ends each child; Hangar logs how it ended.
    for (model, pid) in [("chat", chat_pid), ("embed", embed_pid)] {
        let (status, unloaded) = unload(&server, model).await;
        assert_eq!(
            (status, unloaded["runtime_state"].as_str()),
            (200, Some("unloaded")),
            "{unloaded}"
        );
        assert_eq!(unloaded["runtime_details"], json!([]), "{unloaded}");
        wait_gone(pid, Duration::from_secs(15), model).await;
        let lines = log_lines(&server, model).await;
        let last = lines.last().expect("log lines");
        let line = text(last);
        assert_eq!(last["stream"], "hangar", "{lines:?}");
        assert!(line.starts_with(&format!("pid {pid} ")), "{line}");
        assert!(line.contains("signal 15") || line.contains("status 0"), "{line}");
        assert_eq!(last_start(&lines).map(|(p, _)| p), Some(pid), "{lines:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn load_overrides_change_the_childs_argv() {
    let server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let pid = load_ok(&server, "chat", json!({ "llama_server_n_ctx": 1024 })).await;
    let (started, command) = last_start(&log_lines(&server, "chat").await).expect("a start");
    assert_eq!(started, pid);
    assert!(format!("{command} ").contains(" -c 1024 "), "{command}");
    let shown = row(&server, "chat").await;
    assert_eq!(shown["runtime_details"][0]["command"], command.as_str(), "{shown}");
    assert_eq!(shown["load_override"], json!({ "llama_server_n_ctx": 1024 }), "{shown}");
    chat_ok(&server, "chat", 4).await;

    let (status, body) = unload(&server, "chat").await;
    assert_eq!(status, 200, "{body}");
    // Without a body: the configured context again.
    let (status, body) =
        send(Method::POST, &server.url("/v1/admin/models/chat/load"), None, None).await;
    assert_eq!((status, body["runtime_state"].as_str()), (200, Some("loaded")), "{body}");
    let again = pid_of(&body);
    assert_ne!(again, pid, "a new child");
    let (started, command) = last_start(&log_lines(&server, "chat").await).expect("a start");
    assert_eq!(started, again);
    assert!(format!("{command} ").contains(" -c 2048 "), "{command}");
    assert!(!command.contains(" -c 1024"), "{command}");
}

#[tokio::test]
async fn a_weight_update_swaps_the_child_and_a_failed_one_keeps_the_old_serving() {
    let server = Server::start(&config(json!({ "chat": chat_model(json!({})) })), &[]);
    let first = load_ok(&server, "chat", json!({})).await;
    let content =
        |body: Value| body["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let original = content(chat_ok(&server, "chat", 16).await);

    // The same weights with the final norm zeroed: every logit equal, another greedy answer.
    let changed = temp_dir("llama-server-weights").join("tiny-llama.gguf");
    let source = fixture("tiny-llama.gguf");
    let mut bytes = std::fs::read(&source).unwrap();
    let located = hangar_weights::locate_tensors(Path::new(&source)).unwrap();
    let norm = located.iter().find(|t| t.name == "output_norm.weight").expect("output_norm");
    bytes[norm.range.start as usize..norm.range.end as usize].fill(0);
    std::fs::write(&changed, bytes).unwrap();

    let update = json!({ "model_path": changed, "weight_version": "step-1" });
    let (status, updated) =
        post(&server, "/v1/admin/models/chat/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(
        (updated["weight_version"].as_str(), updated["weights_path"].as_str()),
        (Some("step-1"), changed.to_str())
    );
    let second = pid_of(&updated);
    assert_ne!(second, first, "a new child runs the new weights");
    wait_gone(first, Duration::from_secs(10), "the child of the old weights").await;
    let after = content(chat_ok(&server, "chat", 16).await);
    assert_ne!(after, original, "the new weights answer");

    // Weights that do not load: 400 load_failed, the step-1 child keeps serving.
    let bad = json!({ "model_path": "/nonexistent/w.gguf", "weight_version": "step-2" });
    let (status, body) = post(&server, "/v1/admin/models/chat/update-weights-from-disk", bad).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    let r = row(&server, "chat").await;
    assert_eq!((pid_of(&r), r["weight_version"].as_str()), (second, Some("step-1")), "{r}");
    assert_eq!(content(chat_ok(&server, "chat", 16).await), after);
    assert_eq!(llama_server_children(server.pid()), [second], "no child of the failed update");
}

/// The resident memory (`VmRSS`) of `pid`, in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_childs_host_memory_is_its_process_trees_resident_memory() {
    let cpu = chat_model(json!({ "device": "cpu", "llama_server_n_gpu_layers": 0 }));
    // On a GPU, one of its two layers (this llama-server may have no GPU: it keeps both).
    let beside = chat_model(json!({ "device": "gpu", "llama_server_n_gpu_layers": 1 }));
    let mut settings = config(json!({ "chat": cpu, "beside": beside }));
    settings["ram_budget"] = json!("90%");
    let server = Server::start(&settings, &[]);
    let before = row(&server, "chat").await["host_memory"].clone();
    assert_eq!(before["method"], "gguf_estimate", "{before}");
    // Beside a GPU, the layer left on the CPU: half of the same estimate.
    let half = row(&server, "beside").await["host_memory"].clone();
    let estimate = before["mib"].as_u64().unwrap();
    assert_eq!(half, json!({ "mib": estimate.div_ceil(2), "method": "gguf_estimate" }));
    for model in ["chat", "beside"] {
        let pid = load_ok(&server, model, json!({})).await;
        let loaded = row(&server, model).await["host_memory"].clone();
        assert_eq!(loaded["method"], "process_tree_rss", "{model}: {loaded}");
        // What the child holds now, as the kernel counts it (it grows a little as it serves).
        let rss_kib = vm_rss_kib(pid);
        let mib = loaded["mib"].as_u64().unwrap();
        assert!(mib > 0 && mib <= rss_kib.div_ceil(1024) + 64, "{mib} MiB, VmRSS {rss_kib} kB");
    }
    assert_eq!(unload(&server, "chat").await.0, 200);
    assert_eq!(row(&server, "chat").await["host_memory"], before, "back to the estimate");
}
