//! Model repository folders written by someone who is not the operator, against the real
//! binary and the fake `vllm serve`: every field that reaches the engine's argv set to a
//! flag, an alias that reads as one, every path field a link out of the folder, operator
//! fields, a named pipe called `hangar.json` (present at start-up, and added at run time)
//! and a sparse 1 GiB one. Each breach is reported on its own model; the folder that holds
//! loads with each hostile value inside its own `--flag=value` element, and the configured
//! model is never touched.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::engines::fake_vllm;
use crate::support::{Server, post, row, send, temp_dir};

/// A folder `name` in `repo` holding `files` (name, contents).
fn folder(repo: &Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = repo.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// The index as (name, reason), read within a few seconds.
async fn index(server: &Server) -> Vec<(String, String)> {
    let started = Instant::now();
    let (status, rows) = post(server, "/v2/repository/index", json!({})).await;
    assert_eq!(status, 200, "{rows}");
    assert!(started.elapsed() < Duration::from_secs(20), "the index took {:?}", started.elapsed());
    let rows = rows.as_array().unwrap().iter();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap().to_owned();
    rows.map(|r| (field(r, "name"), field(r, "reason"))).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_folders_reach_no_flag_no_path_outside_and_hang_nothing() {
    let repo = temp_dir("hostile-repo");
    let outside = temp_dir("outside");
    std::fs::write(outside.join("weights.safetensors"), "").unwrap();
    let flag_values = json!({
        "vllm_kv_cache_dtype": "--trust-remote-code",
        "vllm_dtype": "--api-key",
        "vllm_speculative_method": "--enable-auto-tool-choice",
        "aliases": ["flags-alias"],
    });
    folder(&repo, "flags", &[("hangar.json", &flag_values.to_string()), ("config.json", "{}")]);
    let alias = json!({ "aliases": ["--trust-remote-code", "--api-key", "attacker-key"] });
    folder(&repo, "alias", &[("hangar.json", &alias.to_string())]);
    let linked = folder(&repo, "link-model", &[("hangar.json", r#"{"model_path": "w"}"#)]);
    symlink(outside.join("weights.safetensors"), linked.join("w")).unwrap();
    let spec = r#"{"vllm_speculative_method": "eagle", "vllm_speculative_model": "draft"}"#;
    let linked = folder(&repo, "link-draft", &[("hangar.json", spec)]);
    symlink(&outside, linked.join("draft")).unwrap();
    let tree = folder(&repo, "link-tree", &[("config.json", "{}")]);
    symlink("/etc/passwd", tree.join("tokenizer.json")).unwrap();
    let operator = [
        ("hub", json!({ "vllm_model": "/etc" })),
        ("extra", json!({ "vllm_extra_args": ["--trust-remote-code"] })),
        ("media", json!({ "allow_remote_media": true })),
        ("pin", json!({ "pinned": true })),
        ("bind", json!({ "vllm_host": "0.0.0.0" })),
        ("many", json!({ "replicas": 8 })),
    ];
    for (name, definition) in &operator {
        folder(&repo, name, &[("hangar.json", &definition.to_string())]);
    }
    let pipe = folder(&repo, "pipe", &[]);
    mkfifo(&pipe.join("hangar.json"));
    let huge = folder(&repo, "huge", &[]);
    std::fs::File::create(huge.join("hangar.json")).unwrap().set_len(1 << 30).unwrap();
    folder(&repo, "--served-model-name", &[]);

    let settings = json!({
        "max_loaded_models": { "llm": 4 },
        "model_repository": repo,
        "model_repository_defaults": {
            "backend": "vllm_serve",
            "vllm_binary_path": fake_vllm(),
            "vllm_env": { "FAKE_VLLM_TOKEN_DELAY_MS": "0", "FAKE_VLLM_TOKENS": "2" },
        },
        "models": { "configured": { "backend": "stub", "enabled": true } },
    });
    // Start-up reads the folder with the pipe in it, and does not wait on it.
    let server = Server::start(&settings, &[]);
    let reasons = index(&server).await;
    let reason = |name: &str| {
        let found = reasons.iter().find(|(n, _)| n == name);
        found.unwrap_or_else(|| panic!("{name} not indexed: {reasons:?}")).1.clone()
    };
    assert!(!reasons.iter().any(|(n, _)| n.starts_with('-')), "{reasons:?}");
    let expect = [
        ("alias", "aliases[0]: must not start with \"-\""),
        ("link-model", "model_path: \"w\" leads out of the folder"),
        ("link-draft", "vllm_speculative_model: \"draft\" leads out of the folder"),
        ("link-tree", "`tokenizer.json` is a link out of the folder"),
        ("hub", "`vllm_model` is the operator's"),
        ("extra", "`vllm_extra_args` is the operator's"),
        ("media", "`allow_remote_media` is the operator's"),
        ("pin", "`pinned` is the operator's"),
        ("bind", "`vllm_host` is the operator's"),
        ("many", "model_repository_limits.replicas (1)"),
        ("pipe", "hangar.json: is not a regular file"),
        ("huge", "larger than 1048576 bytes"),
    ];
    for (name, want) in expect {
        let got = reason(name);
        assert!(got.contains(want), "{name}: {got}");
        let (status, answer) =
            post(&server, &format!("/v2/repository/models/{name}/load"), json!({})).await;
        assert_ne!(status, 200, "{name} loaded: {answer}");
    }
    assert_eq!(reason("flags"), "unloaded");

    // The folder that holds loads; each hostile value stays inside its flag's element.
    let (status, answer) = post(&server, "/v2/repository/models/flags/load", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let flags = row(&server, "flags").await;
    let pid = flags["runtime_details"][0]["pid"].as_u64().unwrap_or_else(|| panic!("{flags}"));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> =
        cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    for flag in ["--trust-remote-code", "--api-key", "--enable-auto-tool-choice"] {
        assert!(!argv.iter().any(|a| a == flag), "{flag} became a flag: {argv:?}");
    }
    for element in
        ["--served-model-name=flags", "--kv-cache-dtype=--trust-remote-code", "--dtype=--api-key"]
    {
        assert!(argv.iter().any(|a| a == element), "no {element}: {argv:?}");
    }
    let target = repo.canonicalize().unwrap().join("flags");
    let serve = argv.iter().position(|a| a == "serve").unwrap();
    assert_eq!(Path::new(&argv[serve + 1]), target, "{argv:?}");
    // A request naming the alias reaches the child under the one name it serves.
    let chat = json!({ "model": "flags-alias", "max_tokens": 2,
        "messages": [{ "role": "user", "content": "hi" }] });
    let (status, answer) =
        send(reqwest::Method::POST, &server.url("/v1/chat/completions"), Some(&chat), None).await;
    assert_eq!(status, 200, "{answer}");

    // A pipe added at run time does not hang the next index either.
    let later = folder(&repo, "later", &[]);
    mkfifo(&later.join("hangar.json"));
    let reasons = index(&server).await;
    let later = reasons.iter().find(|(n, _)| n == "later").unwrap();
    assert!(later.1.contains("not a regular file"), "{later:?}");
    assert_eq!(row(&server, "configured").await["runtime_state"], "loaded", "untouched");
    std::fs::remove_dir_all(&repo).unwrap();
    std::fs::remove_dir_all(&outside).unwrap();
}
