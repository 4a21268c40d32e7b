//! The reference worker's own tests (`worker/tests`, standard-library `unittest`): the
//! protocol loop, `text.py`, and the ExLlamaV3 and vLLM adapters against fakes of their
//! Python APIs (every spec field's argument mapping), run by `cargo test`.
//!
//! They run under `python3` from `PATH`, where the engines are missing (so the
//! missing-package paths are real), and again under the bridge virtualenv
//! (`HANGAR_BRIDGE_PYTHON`, set by `cargo xtask test`), where the CTranslate2 tests run on the
//! real package instead of being skipped.

use std::path::Path;
use std::process::Command;

/// Runs the suite under `python`; panics with its output when it fails. Its summary line.
fn unittest(python: &str) -> String {
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("worker");
    let output = Command::new(python)
        .args(["-B", "-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&worker)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the worker's tests failed under {python}:\n{stderr}");
    stderr
        .lines()
        .filter(|l| l.starts_with("Ran ") || l.starts_with("OK"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_worker_tests_pass_without_any_engine_installed() {
    let summary = unittest("python3");
    assert!(summary.contains("OK"), "{summary}");
}

#[test]
fn the_worker_tests_pass_with_ctranslate2_for_real_in_the_bridge_virtualenv() {
    let python = std::env::var_os("HANGAR_BRIDGE_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bridge-venv/bin/python"),
        std::path::PathBuf::from,
    );
    assert!(
        python.exists(),
        "no bridge interpreter at {}: run `cargo xtask test`, which creates target/bridge-venv and sets HANGAR_BRIDGE_PYTHON",
        python.display()
    );
    let python = std::path::absolute(&python).unwrap();
    let summary = unittest(python.to_str().unwrap());
    assert!(!summary.contains("skipped"), "nothing skipped with CTranslate2 installed: {summary}");
}
