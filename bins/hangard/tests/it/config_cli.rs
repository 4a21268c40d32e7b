//! `hangard config …` as a user runs it: the real binary, real fixture directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn hangard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hangard"))
        .args(args)
        .env_remove("HANGAR_CONFIG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_prints_the_merged_effective_config() {
    let demo = fixtures().join("demo");
    let out = hangard(&["config", "check", "--config", demo.to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["models"]["chat"]["stub"]["token_latency_ms"], 5, "local.json applied");
    assert_eq!(config["models"]["chat"]["stub"]["load_delay_ms"], 200, "settings.json kept");
    assert_eq!(config["models"]["chat-slow"]["enabled"], false);
    assert_eq!(config["models"]["embed"]["type"], "embedding");
    assert_eq!(config["max_queue_depth"], 64);
    assert_eq!(config["max_request_body_bytes"], 8 << 20, "defaults applied");
}

#[test]
fn raw_prints_the_merge_as_written() {
    let demo = fixtures().join("demo");
    let out = hangard(&["config", "check", "--raw", "--config", demo.to_str().unwrap()]);
    assert!(out.status.success());
    let raw: Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = hangar_config_merged(&demo);
    assert_eq!(raw, expected);
    assert!(raw.get("max_request_body_bytes").is_none(), "no defaults in --raw");
}

fn hangar_config_merged(dir: &Path) -> Value {
    let read = |f: &str| {
        serde_json::from_str::<Value>(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    let mut base = read("settings.json");
    merge(&mut base, read("local.json"));
    base
}

/// An independent re-statement of the merge rule, so this test does not trust the library.
fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

#[test]
fn check_lists_every_problem_with_its_path_and_exits_1() {
    for case in ["exllama-rules", "llama-server-rules", "types", "remote-and-paths", "flag-names"] {
        let dir = fixtures().join("invalid").join(case);
        let out = hangard(&["config", "check", "--config", dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{case}");
        assert!(out.stdout.is_empty(), "{case}: nothing on stdout when invalid");
        let stderr = text(&out.stderr);
        let expected = std::fs::read_to_string(dir.join("expected.txt")).unwrap();
        for line in expected.lines() {
            assert!(
                stderr.contains(&format!("error: {line}\n")),
                "{case}: missing `{line}` in\n{stderr}"
            );
        }
        let n = expected.lines().count();
        assert!(stderr.contains(&format!("{n} problems in")), "{case}: summary in\n{stderr}");
    }
}

#[test]
fn check_json_format_is_machine_readable() {
    let dir = fixtures().join("invalid").join("range");
    let out = hangard(&["config", "check", "--format", "json", "--config", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert_eq!(report["errors"][0]["path"], "models.qwen.gguf_n_ctx");
    assert_eq!(report["errors"][0]["message"], "must be >= 1");
    assert_eq!(report["errors"].as_array().unwrap().len(), 2);
}

#[test]
fn check_fails_clearly_on_a_missing_directory() {
    let out = hangard(&["config", "check", "--config", "/nonexistent/hangar"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/hangar/settings.json"));
}

#[test]
fn schema_prints_a_json_schema() {
    let out = hangard(&["config", "schema"]);
    assert!(out.status.success());
    let schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    let per_backend = &schema["properties"]["models"]["additionalProperties"]["oneOf"][0]["oneOf"];
    assert_eq!(per_backend.as_array().unwrap().len(), hangar_config::BackendKind::ALL.len());
}
