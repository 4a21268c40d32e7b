//! What a GPU check report (`gpu-check.json`, written by `xtask/gpu-check/check.py`) must
//! hold to pass: every phase, in order, `ok`; every check present and `ok`; every figure
//! present and not null. `docs/gpu-check.md` documents the format.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// Which run wrote the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `run.sh` on the lent GPU machine.
    Device,
    /// `cargo xtask gpu-check --dry-run` here.
    DryRun,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Device => "device",
            Self::DryRun => "dry_run",
        }
    }
}

/// The phases, in the order they run.
pub(crate) const PHASES: [&str; 9] =
    ["setup", "build", "gguf", "telemetry", "load", "eviction", "release", "kill", "sleep"];

/// Checks both runs make.
const CHECKS: &[&str] = &[
    "nvidia_smi_reads_the_gpu",
    "llama_cpp_tree_configures",
    "gguf_written",
    "gpu_memory_lists_the_gpu",
    "gpu_memory_used_mib_matches_nvidia_smi",
    "gpu_memory_total_mib_matches_nvidia_smi",
    "metrics_match_nvidia_smi",
    "model_a_loads_on_the_gpu",
    "process_tree_figure_is_measured",
    "process_tree_matches_nvidia_smi",
    "weights_fully_on_the_gpu",
    "observed_delta_covers_the_engine",
    "gguf_estimate_is_a_lower_bound",
    "completion_runs_on_the_gpu_engine",
    "hangard_drains_and_exits_0_on_sigterm",
    "sigterm_gives_the_gpu_memory_back",
    "measured_figure_survives_a_restart",
    "a_loads_under_the_budget",
    "b_evicts_a_for_memory",
    "b_is_placed_on_gpu_0",
    "b_child_sees_gpu_0_in_pci_bus_order",
    "b_host_part_is_measured",
    "b_is_leased",
    "a_is_refused_507_insufficient_vram",
    "the_refusal_evicts_nothing",
    "gpu_memory_shows_the_budget",
    "memory_comes_back_after_unload",
    "an_engine_is_on_the_gpu_before_the_kill",
    "no_process_of_hangard_on_the_gpu_after_kill_9",
    "c_loads_in_process",
    "c_answers_before_sleeping",
    "c_sleeps_and_stays_loaded",
    "a_sleeping_model_is_ready",
    "c_wakes",
    "c_answers_as_before_after_waking",
    "a_request_wakes_c_with_the_same_answer",
    "hangard_3_exits_0_on_sigterm",
];

/// Checks only the device run makes (the dry run builds no CUDA `llama-server`, and its
/// in-process engine runs on the CPU).
const DEVICE_CHECKS: &[&str] = &[
    "cuda_llama_server_builds",
    "llama_server_sees_cuda",
    "hangard_links_the_cuda_libraries",
    "sleep_gives_gpu_memory_back",
    "weights_stay_on_the_gpu_while_asleep",
    "wake_takes_the_memory_back",
];

/// Figures both reports carry, as dotted paths from the report's root.
const FIGURES: &[&str] = &[
    "total_s",
    "machine.gpu.name",
    "machine.gpu.compute_cap",
    "machine.gpu.total_mib",
    "figures.build.unpack_s",
    "figures.build.configure_s",
    "figures.build.total_s",
    "figures.build.binary_mib",
    "figures.gguf.mib",
    "figures.gguf.seconds",
    "figures.gguf.shape.layers",
    "figures.telemetry.nvidia_smi.used_mib",
    "figures.telemetry.nvidia_smi.total_mib",
    "figures.telemetry.gpu_memory.gpus",
    "figures.telemetry.metrics.hangar_gpu_memory_used_bytes",
    "figures.telemetry.metrics.hangar_gpu_memory_total_bytes",
    "figures.load.load_s",
    "figures.load.engine_pids",
    "figures.load.process_tree_mib",
    "figures.load.nvidia_smi_tree_mib",
    "figures.load.observed_delta_mib",
    "figures.load.gguf_estimate_mib",
    "figures.load.gguf_weights_mib",
    "figures.load.gguf_kv_cache_mib",
    "figures.load.admission_mib",
    "figures.load.overhead_over_estimate_mib",
    "figures.load.memory_back_after_sigterm_s",
    "figures.eviction.vram_budget_mib",
    "figures.eviction.b_load_s",
    "figures.eviction.b_placement.gpus",
    "figures.eviction.b_child_cuda.CUDA_VISIBLE_DEVICES",
    "figures.eviction.refusal.vram_shortfall.missing_mib",
    "figures.eviction.refusal.vram_shortfall.holders",
    "figures.release.unload_request_s",
    "figures.release.memory_back_s",
    "figures.release.used_after_mib",
    "figures.kill.gone_s",
    "figures.kill.used_after_mib",
    "figures.sleep.load_s",
    "figures.sleep.sleep_s",
    "figures.sleep.wake_s",
    "figures.sleep.wake_over_load",
    "figures.sleep.completion_that_wakes_s",
    "figures.sleep.used_loaded_mib",
    "figures.sleep.used_asleep_mib",
    "figures.sleep.used_woken_mib",
    "figures.sleep.smi_freed_mib",
    "figures.sleep.residency_asleep.gpu_freed_mib",
];

/// Figures only the device report carries.
const DEVICE_FIGURES: &[&str] = &[
    "machine.nvcc",
    "figures.build.compile_s",
    "figures.build.jobs",
    "figures.build.cuda_architectures",
    "figures.sleep.gguf_kv_cache_mib",
    "figures.sleep.hangard_asleep_mib",
];

/// What the device tool brings back at most.
const OUT_FILES: usize = 8;
const OUT_FILE_BYTES: u64 = 16 << 20;

/// The problems of the report at `path` (none: it passes).
///
/// # Errors
/// When the file cannot be read or is no JSON.
pub(crate) fn verify_file(path: &Path, mode: Mode) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("no report at {}", path.display()))?;
    let report: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is no JSON", path.display()))?;
    Ok(verify(&report, mode))
}

/// The problems of `report`, one line each: a wrong mode, an unfinished run, a phase missing,
/// out of order or not `ok`, a check missing or failed, a figure missing or null.
pub(crate) fn verify(report: &Value, mode: Mode) -> Vec<String> {
    let mut problems = Vec::new();
    if report["schema"] != 1 {
        problems.push(format!("schema {}, expected 1", report["schema"]));
    }
    if report["mode"] != mode.as_str() {
        problems.push(format!("mode {}, expected {:?}", report["mode"], mode.as_str()));
    }
    if report["finished"] != true {
        problems.push("the run did not finish (cut short: see check.log)".into());
    }
    let phases = report["phases"].as_array().map(Vec::as_slice).unwrap_or_default();
    let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
    if names != PHASES {
        problems.push(format!("phases {names:?}, expected {PHASES:?}"));
    }
    for phase in phases {
        if phase["status"] != "ok" {
            problems
                .push(format!("phase {} {}: {}", phase["name"], phase["status"], phase["error"]));
        }
        if !phase["seconds"].is_number() {
            problems.push(format!("phase {} has no seconds", phase["name"]));
        }
    }
    let checks = report["checks"].as_array().map(Vec::as_slice).unwrap_or_default();
    let device = if mode == Mode::Device { DEVICE_CHECKS } else { &[] };
    for name in CHECKS.iter().chain(device) {
        match checks.iter().find(|c| c["name"] == *name) {
            None => problems.push(format!("check {name} missing")),
            Some(c) if c["ok"] != true => {
                problems.push(format!("check {name} failed: {}", c["detail"]));
            }
            Some(_) => {}
        }
    }
    for c in checks.iter().filter(|c| c["ok"] != true) {
        if !CHECKS.iter().chain(DEVICE_CHECKS).any(|n| c["name"] == *n) {
            problems.push(format!("check {} failed: {}", c["name"], c["detail"]));
        }
    }
    let device = if mode == Mode::Device { DEVICE_FIGURES } else { &[] };
    for path in FIGURES.iter().chain(device) {
        let value = path.split('.').fold(report, |v, key| &v[key]);
        if value.is_null() {
            problems.push(format!("figure {path} missing"));
        }
    }
    if report["ok"] != true && problems.is_empty() {
        problems.push("the report says ok: false".into());
    }
    problems
}

/// What the device tool would not bring back of `out`: more than [`OUT_FILES`] files, one over
/// 16 MiB, or one deeper than `out/a/b/file`.
///
/// # Errors
/// When `out` cannot be read.
pub(crate) fn out_limits(out: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    walk(out, 0, &mut files)?;
    let mut problems = Vec::new();
    if files.len() > OUT_FILES {
        problems.push(format!(
            "{} files under {}, at most {OUT_FILES}",
            files.len(),
            out.display()
        ));
    }
    for (path, depth, bytes) in files {
        if depth > 2 {
            problems.push(format!("{} is deeper than OUT/a/b/file", path.display()));
        }
        if bytes > OUT_FILE_BYTES {
            problems.push(format!("{} is over 16 MiB ({bytes} bytes)", path.display()));
        }
    }
    Ok(problems)
}

fn walk(dir: &Path, depth: usize, files: &mut Vec<(std::path::PathBuf, usize, u64)>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(&entry.path(), depth + 1, files)?;
        } else {
            files.push((entry.path(), depth, meta.len()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A dry-run report with every phase, check and figure.
    fn passing() -> Value {
        let mut report = json!({
            "schema": 1, "mode": "dry_run", "ok": true, "finished": true,
            "phases": PHASES.iter().map(|p| json!({"name": p, "status": "ok", "seconds": 1.0}))
                .collect::<Vec<_>>(),
            "checks": CHECKS.iter().map(|c| json!({"name": c, "ok": true, "detail": ""}))
                .collect::<Vec<_>>(),
        });
        for path in FIGURES {
            let mut at = &mut report;
            let keys: Vec<&str> = path.split('.').collect();
            for key in &keys[..keys.len() - 1] {
                if at[*key].is_null() {
                    at[*key] = json!({});
                }
                at = &mut at[*key];
            }
            at[keys[keys.len() - 1]] = json!(1);
        }
        report
    }

    #[test]
    fn a_report_with_every_phase_check_and_figure_passes() {
        assert_eq!(verify(&passing(), Mode::DryRun), Vec::<String>::new());
    }

    #[test]
    fn a_missing_figure_is_named() {
        let mut report = passing();
        report["figures"]["load"]["process_tree_mib"] = Value::Null;
        assert_eq!(verify(&report, Mode::DryRun), ["figure figures.load.process_tree_mib missing"]);
    }

    #[test]
    fn a_failed_or_missing_check_fails_the_report() {
        let mut report = passing();
        report["checks"][0]["ok"] = json!(false);
        report["checks"].as_array_mut().unwrap().pop();
        let problems = verify(&report, Mode::DryRun);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("check nvidia_smi_reads_the_gpu failed"), "{problems:?}");
        assert!(problems[1].contains("hangard_3_exits_0_on_sigterm missing"), "{problems:?}");
    }

    #[test]
    fn a_phase_cut_short_or_an_unfinished_run_fails_the_report() {
        let mut report = passing();
        report["phases"][5]["status"] = json!("timed_out");
        report["finished"] = json!(false);
        let problems = verify(&report, Mode::DryRun);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn a_device_report_needs_the_cuda_build_checks_and_figures() {
        let mut report = passing();
        report["mode"] = json!("device");
        let problems = verify(&report, Mode::Device);
        assert!(problems.iter().any(|p| p.contains("cuda_llama_server_builds missing")));
        assert!(problems.iter().any(|p| p.contains("figures.build.compile_s missing")));
    }
}
