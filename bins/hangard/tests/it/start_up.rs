//! Start-up that respects its slots, as a user sees it: `config check` warns of enabled
//! models that will not all fit, `serve` loads them in config order without evicting one
//! for another, logs what happened to each, and `/readyz` names the one left out.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Server, hangard, temp_dir};

/// Two enabled llms for the default one llm slot, and an embedding model.
fn settings() -> Value {
    json!({ "models": {
        "first": { "backend": "stub", "enabled": true, "stub": { "load_delay_ms": 50 } },
        "second": { "backend": "stub", "enabled": true },
        "embed": { "backend": "stub", "enabled": true, "labels": ["embedding"] }
    } })
}

#[test]
fn config_check_warns_of_enabled_models_beyond_their_types_slots_and_still_passes() {
    let dir = temp_dir("slots");
    std::fs::write(dir.join("settings.json"), settings().to_string()).unwrap();
    let out = hangard().args(["config", "check", "--config"]).arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a warning is not an error: {stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(
        warnings,
        ["warning: 2 llm models are enabled but max_loaded_models.llm is 1: start-up loads first \
          and leaves second unloaded (loaded on demand, evicting another)"]
    );
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["max_loaded_models"]["llm"], 1, "the config is printed as before");

    let out = hangard()
        .args(["config", "check", "--format", "json", "--config"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"], true);
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].as_str().unwrap().contains("leaves second unloaded"), "{report}");

    // With a slot each, no warning.
    let mut roomy = settings();
    roomy["max_loaded_models"] = json!({ "llm": 2 });
    std::fs::write(dir.join("settings.json"), roomy.to_string()).unwrap();
    let out = hangard().args(["config", "check", "--config"]).arg(&dir).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn serve_loads_in_config_order_never_evicts_an_enabled_model_and_logs_each() {
    let server = Server::start(&settings(), &[]);
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let response = client.get(server.url("/readyz")).send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        if status == 200 {
            break body;
        }
        assert!(Instant::now() < deadline, "not ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        body["not_serving"],
        json!([{ "model": "second", "reason": "no_slot", "holds_readiness": false }])
    );
    let rows = client.get(server.url("/v1/admin/models")).send().await.unwrap();
    let rows: Value = rows.json().await.unwrap();
    let state = |name: &str| {
        let row = rows["models"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap();
        row["runtime_state"].as_str().unwrap().to_owned()
    };
    assert_eq!([state("first"), state("second"), state("embed")], ["loaded", "unloaded", "loaded"]);
    let logs = server.logs();
    let said: Vec<&str> = logs.lines().filter(|l| l.contains("start-up:")).collect();
    let position = |needle: &str| said.iter().position(|l| l.contains(needle));
    let first = position("model=first").expect("first logged");
    let second = position("model=second").expect("second logged");
    let embed = position("model=embed").expect("embed logged");
    assert!(first < second && second < embed, "config order:\n{}", said.join("\n"));
    assert!(said[first].contains("enabled model loaded"), "{}", said[first]);
    assert!(said[second].contains("left unloaded"), "{}", said[second]);
    assert!(said[embed].contains("enabled model loaded"), "{}", said[embed]);
    assert!(!logs.contains("evicting"), "start-up evicted a model:\n{logs}");
}
