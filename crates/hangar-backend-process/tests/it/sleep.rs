//! vLLM's sleep mode on `vllm_serve` children, against the fake `vllm serve` (which keeps
//! vLLM's routes and their state: `/sleep`, `/wake_up`, `/collective_rpc`, `/is_sleeping`):
//! the child listens only on a Unix socket in a private directory, sleeps at both levels,
//! wakes (reloading the weights after level 2, without which it answers garbage), and a
//! model without sleep mode says it cannot sleep.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{
    Backend, ForwardRequest, ForwardRoute, LoadRequest, Runtime, RuntimeError, SleepLevel,
    ThinkingMode,
};
use hangar_backend_process::ProcessBackend;
use serde_json::{Value, json};

use crate::support::model;

async fn load(extra: Value) -> Arc<dyn Runtime> {
    let backend = ProcessBackend::vllm_serve().with_stop_grace(Duration::from_millis(500));
    backend.load(LoadRequest::new(model(extra), 0, 1)).await.expect("the fake loads")
}

/// The text of a greedy chat answer through Hangar's client.
async fn answer(runtime: &Arc<dyn Runtime>) -> String {
    let body = r#"{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from_static(body.as_bytes()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: hangar_config::DEFAULT_MAX_ANSWER_BYTES,
    };
    let mut answer = runtime.forward(request).await.expect("forwarded");
    assert_eq!(answer.status, 200);
    let body = answer.body.recv().await.unwrap().unwrap();
    let value: Value = serde_json::from_slice(&body).unwrap();
    value["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
}

/// The child's command line.
fn argv(runtime: &Arc<dyn Runtime>) -> Vec<String> {
    let pid = runtime.details()["pid"].as_i64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

fn environ(runtime: &Arc<dyn Runtime>, name: &str) -> Option<String> {
    let pid = runtime.details()["pid"].as_i64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let prefix = format!("{name}=");
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_with_sleep_mode_listens_only_on_a_private_socket_and_sleeps_at_both_levels() {
    let runtime = load(json!({ "vllm_enable_sleep_mode": true })).await;
    assert_eq!(
        runtime.capabilities().sleep_levels,
        [SleepLevel::WeightsToHost, SleepLevel::WeightsDiscarded]
    );
    // On a Unix socket in a directory only this user can enter; no port, no host.
    let socket = PathBuf::from(runtime.details()["socket"].as_str().unwrap());
    let dir = socket.parent().unwrap().to_owned();
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let args = argv(&runtime);
    let uds = args.iter().find_map(|a| a.strip_prefix("--uds=")).expect("--uds");
    assert_eq!(PathBuf::from(uds), socket);
    assert!(args.iter().any(|a| a == "--enable-sleep-mode"), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--port") || a.starts_with("--host")), "{args:?}");
    assert_eq!(environ(&runtime, "VLLM_SERVER_DEV_MODE").as_deref(), Some("1"));
    assert_eq!(answer(&runtime).await, "word0 word1");

    // Level 1, then awake again: the same answer.
    runtime.sleep(SleepLevel::WeightsToHost).await.expect("sleeps at level 1");
    runtime.sleep(SleepLevel::WeightsToHost).await.expect("asleep again is Ok");
    runtime.wake().await.expect("wakes");
    assert_eq!(answer(&runtime).await, "word0 word1");
    runtime.wake().await.expect("awake already is Ok");

    // Level 2 discards the weights: the wake reloads them, or the engine would answer
    // garbage (the fake does, as vLLM would from memory never reloaded).
    runtime.sleep(SleepLevel::WeightsDiscarded).await.expect("sleeps at level 2");
    runtime.wake().await.expect("wakes from level 2");
    assert_eq!(answer(&runtime).await, "word0 word1");

    let refused = runtime.sleep(SleepLevel::Context).await.unwrap_err();
    assert!(matches!(refused, RuntimeError::Unsupported { .. }), "{refused:?}");
    runtime.unload().await;
    assert!(!dir.exists(), "the socket's directory goes with the runtime");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_without_sleep_mode_cannot_sleep_and_a_refused_sleep_says_why() {
    // Development mode stays off without sleep mode, whatever the model's environment says,
    // on its private socket as on a port.
    let runtime = load(json!({ "vllm_env": { "VLLM_SERVER_DEV_MODE": "1" } })).await;
    assert_eq!(environ(&runtime, "VLLM_SERVER_DEV_MODE").as_deref(), Some("0"));
    assert!(runtime.capabilities().sleep_levels.is_empty());
    assert!(runtime.details().get("socket").is_some(), "on its private socket");
    let refused = runtime.sleep(SleepLevel::WeightsToHost).await.unwrap_err();
    assert!(matches!(refused, RuntimeError::Unsupported { .. }), "{refused:?}");
    runtime.unload().await;

    // Sleep mode asked for, the development routes off (an operator's vllm_env overriding
    // what Hangar sets is not possible: the variable is Hangar's); a child whose engine
    // refuses the sleep (here: started without `--enable-sleep-mode`, by a wrapper that
    // drops it) is reported with vLLM's answer and stays awake.
    let wrapper = std::env::temp_dir().join(format!("vllm-no-sleep-{}", std::process::id()));
    let script = format!(
        "#!/bin/sh\nfor a; do shift; [ \"$a\" = --enable-sleep-mode ] || set -- \"$@\" \"$a\"; done\nexec {} \"$@\"\n",
        crate::support::FAKE
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = load(json!({
        "vllm_enable_sleep_mode": true,
        "vllm_binary_path": wrapper.to_str().unwrap(),
    }))
    .await;
    let refused = runtime.sleep(SleepLevel::WeightsToHost).await.unwrap_err();
    let RuntimeError::Failed { message } = &refused else { panic!("{refused:?}") };
    assert!(message.contains("500") && message.contains("Sleep mode is not enabled"), "{message}");
    assert_eq!(answer(&runtime).await, "word0 word1", "it serves on");
    runtime.unload().await;
    std::fs::remove_file(wrapper).unwrap();
}

#[test]
fn sleep_mode_and_a_port_or_host_are_a_config_error() {
    let value = |field: &str, v: Value| {
        json!({
            "backend": "vllm_serve", "vllm_binary_path": crate::support::FAKE,
            "vllm_model": "m", "vllm_enable_sleep_mode": true, field: v,
        })
    };
    let name = hangar_config::ModelName::new("fake").unwrap();
    for (field, v) in [("vllm_port", json!(8000)), ("vllm_host", json!("0.0.0.0"))] {
        let errors = hangar_config::ModelConfig::parse(&name, &value(field, v)).unwrap_err();
        let text = format!("{errors:?}");
        assert!(text.contains(field) && text.contains("Unix socket"), "{text}");
    }
    let errors = hangar_config::ModelConfig::parse(
        &name,
        &json!({ "backend": "vllm_serve", "vllm_model": "m", "vllm_extra_args": ["--uds", "/x"] }),
    )
    .unwrap_err();
    assert!(format!("{errors:?}").contains("--uds"), "{errors:?}");
}
