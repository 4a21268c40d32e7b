//! GPU telemetry as operators see it: `GET /v1/admin/gpu-memory` of the real `hangard`,
//! once on this machine's own loader (no NVIDIA driver in CI: empty `gpus` and NVML's
//! reason) and once on a fake `libnvidia-ml.so.1` (`crates/hangar-gpu/tests/fake`, compiled
//! here with `cc`) named by `HANGAR_NVML_LIBRARY`, whose scripted readings change between
//! requests.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use support::{Server, get, temp_dir};

fn config() -> serde_json::Value {
    json!({ "models": { "chat": { "backend": "stub", "enabled": true } } })
}

/// The fake NVML library, compiled into a fresh directory; its path.
fn fake_nvml() -> PathBuf {
    let dir = temp_dir("fake-nvml");
    let out = dir.join("libnvidia-ml.so.1");
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/hangar-gpu/tests/fake/libnvidia-ml.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) runs");
    assert!(status.success(), "cc failed on {}", source.display());
    out
}

#[tokio::test]
async fn without_a_driver_gpu_memory_answers_200_with_no_gpus_and_nvmls_reason() {
    let nvidia = Path::new("/proc/driver/nvidia/version").exists();
    let server = Server::start(&config(), &[]);
    let (status, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["models"][0]["name"], "chat", "{body}");
    if nvidia {
        // A machine with a driver: the real GPUs.
        assert!(!body["gpus"].as_array().unwrap().is_empty(), "{body}");
    } else {
        assert_eq!(body["gpus"], json!([]), "{body}");
        let error = body["error"].as_str().unwrap_or_else(|| panic!("a reason: {body}"));
        assert!(
            error.contains("NVML") && error.contains("libnvidia-ml"),
            "NVML's own reason: {error}"
        );
    }
}

#[tokio::test]
async fn with_an_nvml_library_gpu_memory_lists_its_gpus_as_they_change() {
    let library = fake_nvml();
    let script = library.with_file_name("nvml-script");
    std::fs::write(
        &script,
        "gpu 0 75603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n\
         gpu 1 1024 24576 NVIDIA GeForce RTX 4090\n\
         proc 0 4242 70000\n",
    )
    .unwrap();
    let env = [("HANGAR_NVML_LIBRARY", library.to_str().unwrap())];
    let server = Server::start_with(&config(), &[], &env);
    let (status, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"], serde_json::Value::Null, "{body}");
    assert_eq!(
        body["gpus"],
        json!([
            { "index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
              "used_mib": 75603, "total_mib": 97887, "used_over_total": "75603MiB / 97887MiB" },
            { "index": 1, "name": "NVIDIA GeForce RTX 4090",
              "used_mib": 1024, "total_mib": 24576, "used_over_total": "1024MiB / 24576MiB" },
        ])
    );
    // The same figures for Prometheus, in bytes.
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    for line in [
        "hangar_gpu_telemetry_available 1".to_owned(),
        format!("hangar_gpu_memory_used_bytes{{gpu=\"0\"}} {}", 75603u64 << 20),
        format!("hangar_gpu_memory_total_bytes{{gpu=\"1\"}} {}", 24576u64 << 20),
    ] {
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    }
    // Memory released between two requests: the next answer says so.
    std::fs::write(&script, "gpu 0 5603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n")
        .unwrap();
    let (_, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(body["gpus"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["gpus"][0]["used_over_total"], "5603MiB / 97887MiB", "{body}");
}
