//! The model repository folder (`model_repository`) through the v2 repository routes, as
//! KServe's multi-model agent uses them: a model folder that appears after start-up is
//! indexed and loaded; its folder deleted, its unload still succeeds and it leaves; a folder
//! without `hangar.json` is served from `model_repository_defaults`; a malformed
//! `hangar.json` is reported on its model alone (index `reason`, row `last_error`); a folder
//! whose weights are no GGUF fails its own load and evicts no other model.

use std::path::{Path, PathBuf};

use hangar_server::HangarService;
use serde_json::{Value, json};

use crate::support::{call, server};

fn repository(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hangar-v2-repo-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn service(dir: &Path) -> HangarService {
    server()
        .settings(json!({
            "max_loaded_models": { "llm": 4 },
            "model_repository": dir,
            "model_repository_defaults": { "backend": "stub", "stub": { "load_delay_ms": 5 } },
        }))
        .models(json!({ "configured": { "backend": "stub" } }))
        .stub_kinds([hangar_config::BackendKind::LlamaCpp])
        .build()
}

/// The index as (name, state, reason).
async fn index(s: &HangarService) -> Vec<(String, String, String)> {
    let (status, rows) = call(s, http::Method::POST, "/v2/repository/index", json!({})).await;
    assert_eq!(status, 200, "{rows}");
    let field = |row: &Value, key: &str| row[key].as_str().unwrap().to_owned();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (field(r, "name"), field(r, "state"), field(r, "reason")))
        .collect()
}

fn row(name: &str, state: &str, reason: &str) -> (String, String, String) {
    (name.into(), state.into(), reason.into())
}

#[tokio::test]
async fn a_folder_that_appears_is_loaded_and_one_deleted_is_unloaded_and_leaves() {
    let dir = repository("agent");
    let s = service(&dir);
    assert_eq!(index(&s).await, [row("configured", "UNAVAILABLE", "unloaded")]);

    // The agent downloads a model, then asks for its load with `{}`.
    std::fs::create_dir_all(dir.join("downloaded")).unwrap();
    std::fs::write(dir.join("downloaded/weights.bin"), "").unwrap();
    let load = "/v2/repository/models/downloaded/load";
    let (status, answer) = call(&s, http::Method::POST, load, json!({})).await;
    assert_eq!((status, &answer), (200, &json!({})));
    assert_eq!(
        index(&s).await,
        [row("configured", "UNAVAILABLE", "unloaded"), row("downloaded", "READY", "")]
    );
    let (_, model) = call(&s, http::Method::GET, "/v1/admin/models/downloaded", "").await;
    assert_eq!(model["definition"]["model_path"], json!(dir.join("downloaded")), "{model}");
    assert_eq!(model["definition"]["stub"]["load_delay_ms"], 5, "the defaults apply");

    // On removal the agent deletes the folder first, then unloads: that succeeds, and the
    // model leaves.
    std::fs::remove_dir_all(dir.join("downloaded")).unwrap();
    let unload = "/v2/repository/models/downloaded/unload";
    let (status, answer) = call(&s, http::Method::POST, unload, json!({})).await;
    assert_eq!((status, &answer), (200, &json!({})));
    assert_eq!(index(&s).await, [row("configured", "UNAVAILABLE", "unloaded")]);
    // Asked again (the agent retries), the unload still succeeds.
    assert_eq!(call(&s, http::Method::POST, unload, json!({})).await.0, 200);
    let (status, _) = call(&s, http::Method::GET, "/v1/admin/models/downloaded", "").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_malformed_definition_is_reported_on_its_model_alone() {
    let dir = repository("malformed");
    std::fs::create_dir_all(dir.join("good")).unwrap();
    std::fs::create_dir_all(dir.join("bad")).unwrap();
    std::fs::write(dir.join("bad/hangar.json"), r#"{"backend": "stub", "replicas": 0}"#).unwrap();
    let s = service(&dir);
    let rows = index(&s).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    let bad = rows.iter().find(|r| r.0 == "bad").unwrap();
    assert_eq!(bad.1, "UNAVAILABLE");
    assert!(bad.2.contains("hangar.json: replicas: must be >= 1"), "{bad:?}");
    // Its load fails with the reason; its row says it; the others load.
    let (status, refused) =
        call(&s, http::Method::POST, "/v2/repository/models/bad/load", json!({})).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("replicas: must be >= 1"), "{refused}");
    let (_, bad_row) = call(&s, http::Method::GET, "/v1/admin/models/bad", "").await;
    assert!(bad_row["last_error"].as_str().unwrap().contains("replicas"), "{bad_row}");
    for good in ["good", "configured"] {
        let path = format!("/v2/repository/models/{good}/load");
        assert_eq!(call(&s, http::Method::POST, &path, json!({})).await.0, 200, "{good}");
    }
    // Fixed on disk, the next index shows it fixed, and it loads.
    std::fs::write(dir.join("bad/hangar.json"), r#"{"backend": "stub"}"#).unwrap();
    let rows = index(&s).await;
    assert!(rows.contains(&row("bad", "UNAVAILABLE", "unloaded")), "{rows:?}");
    let load = "/v2/repository/models/bad/load";
    assert_eq!(call(&s, http::Method::POST, load, json!({})).await.0, 200);
}

#[tokio::test]
async fn a_folder_with_broken_weights_fails_its_load_and_evicts_nothing() {
    let dir = repository("broken-weights");
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    let definition = r#"{"backend": "llama_cpp", "model_path": "m.gguf"}"#;
    std::fs::write(dir.join("broken/hangar.json"), definition).unwrap();
    // GGUF's magic and version, one tensor announced, then nothing.
    let header = [&b"GGUF"[..], &3u32.to_le_bytes(), &1u64.to_le_bytes(), &0u64.to_le_bytes()];
    std::fs::write(dir.join("broken/m.gguf"), header.concat()).unwrap();
    let s = service(&dir);
    let load = |name: &str| format!("/v2/repository/models/{name}/load");
    assert_eq!(call(&s, http::Method::POST, &load("configured"), json!({})).await.0, 200);
    let (status, failed) = call(&s, http::Method::POST, &load("broken"), json!({})).await;
    assert!(status >= 400, "{status} {failed}");
    assert!(failed["error"].as_str().unwrap().contains("not a GGUF file"), "{failed}");
    let rows = index(&s).await;
    assert!(rows.contains(&row("configured", "READY", "")), "nothing evicted: {rows:?}");
}
