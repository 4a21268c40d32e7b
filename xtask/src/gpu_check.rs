//! `cargo xtask gpu-check`: one prepared run of everything Hangar claims about GPUs, for a
//! lent machine with one NVIDIA GPU (no Rust, no network, at most 64 MiB carried from here).
//!
//! - `cargo xtask gpu-check` assembles the carried folder (default `<root>/.gpu-check`, which
//!   git ignores): a stripped release `hangard` whose in-process llama.cpp engine links
//!   llama.cpp's shared libraries (`--features llama-cpp-shared`), the llama.cpp tree of the
//!   pinned `llama-cpp-python` sdist trimmed to what `llama-server` needs ([`trimmed_tree`]),
//!   from which the device builds `llama-server` and those libraries with CUDA, and the
//!   scripts of `xtask/gpu-check`. It
//!   measures what the device tool would send (that folder plus the repository's tracked and
//!   untracked-unignored files), refuses over [`CARRY_LIMIT`], and prints the device command.
//! - `cargo xtask gpu-check --dry-run` runs the same `run.sh` here: the fake NVML of
//!   `hangar-gpu` kept true by a pretend driver (`xtask/gpu-check/dry-run/fake_gpu.py`), a fake
//!   `nvidia-smi` reading the same script, and a "GPU" `llama-server` that registers a footprint
//!   and becomes the CPU `llama-server` of `cargo xtask llama-server`. The build phase unpacks
//!   and configures the carried tree (for the CPU). Then [`report::verify`] asserts the report.
//! - `cargo xtask gpu-check --report FILE` asserts a report the device run returned.
//!
//! `docs/gpu-check.md` describes the run, its phases and the report.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, deps, llama_server, run as run_checked, venv};

mod report;

/// What the device tool carries at most: the working tree plus the carried paths.
const CARRY_LIMIT: u64 = 64 << 20;
/// The scripts of `xtask/gpu-check` that travel.
const SCRIPTS: [&str; 6] =
    ["run.sh", "check.py", "phases.py", "sleeping.py", "support.py", "gguf.py"];
/// Where the carried `hangard` finds `libllama-common` first (its `DT_RPATH`, `$ORIGIN/lib`:
/// `bins/hangard/build.rs`), and the library's file name.
const COMMON_DIR: &str = "lib";
const COMMON_LIB: &str = "libllama-common.so.0";
/// The trimmed llama.cpp tree's name in the carried folder.
const TARBALL: &str = "llama.cpp.tar.gz";
/// What of the sdist's `vendor/llama.cpp` stays out of the tarball: documentation, the
/// vocabulary GGUFs, tests, examples, Python, the web UI's sources (the build embeds no UI
/// without npm) and every ggml backend but the CPU and CUDA ones. `*.py` matches in the top
/// folder only. The CMake of the rest still configures with the options `check.py` passes.
const TRIM: &[&str] = &[
    "docs",
    "models",
    "tests",
    "examples",
    "pocs",
    "benches",
    "media",
    "gguf-py",
    "conversion",
    "requirements",
    "skills",
    "ci",
    "app",
    "*.py",
    "scripts/apple",
    "scripts/hip",
    "scripts/snapdragon",
    "scripts/jinja",
    ".devops",
    ".github",
    "tools/ui/src",
    "tools/ui/tests",
    "tools/ui/static",
    "tools/ui/package-lock.json",
    "ggml/src/ggml-vulkan",
    "ggml/src/ggml-sycl",
    "ggml/src/ggml-metal",
    "ggml/src/ggml-opencl",
    "ggml/src/ggml-cann",
    "ggml/src/ggml-musa",
    "ggml/src/ggml-hip",
    "ggml/src/ggml-webgpu",
    "ggml/src/ggml-hexagon",
    "ggml/src/ggml-openvino",
    "ggml/src/ggml-et",
    "ggml/src/ggml-zdnn",
    "ggml/src/ggml-virtgpu",
    "ggml/src/ggml-zendnn",
    "ggml/src/ggml-blas",
    "ggml/src/ggml-rpc",
    "ggml/src/ggml-cpu/spacemit",
    "ggml/src/ggml-cpu/kleidiai",
];
/// The pretend GPU of the dry run: its used memory before any engine, its total and name.
const FAKE_GPU: (&str, &str, &str) = ("600", "81559", "NVIDIA H100 80GB HBM3 (fake)");
/// The dry run's GGUF: small enough for the CPU, the same writer and architecture.
const DRY_RUN_GGUF: &str = "--embd 512 --layers 4 --ff 1536";
/// The dry run's deadline for the whole script, in seconds.
const DRY_RUN_DEADLINE_S: &str = "300";
/// What the device command may take: the script's deadline (460 s) plus its hard stop and
/// the copy back, with room left in a 15-minute lease for a second try.
const DEVICE_TIMEOUT_S: u32 = 540;

/// `cargo xtask gpu-check`: assembles `into` (default `<root>/.gpu-check`) and prints the
/// device command.
pub(crate) fn prepare(root: &Path, into: Option<PathBuf>) -> Result<()> {
    let bundle = match into {
        Some(dir) => std::path::absolute(&dir)?,
        None => root.join(".gpu-check"),
    };
    let repo = git_toplevel(bundle.parent().context("the folder has no parent")?)?;
    let relative = bundle
        .strip_prefix(&repo)
        .with_context(|| format!("{} is not inside {}", bundle.display(), repo.display()))?
        .to_path_buf();
    if !git_ignores(&repo, &relative)? {
        bail!(
            "{} is not ignored by git in {}: the device tool would send it twice (add `/{}/` to \
             .gitignore or .git/info/exclude)",
            bundle.display(),
            repo.display(),
            relative.display()
        );
    }
    let hangard = release_hangard(root)?;
    let tarball = trimmed_tree(root)?;
    fill(root, &bundle, &tarball)?;
    let stripped = bundle.join("hangard");
    std::fs::copy(&hangard, &stripped).context("cannot copy hangard")?;
    let mut strip = Command::new("strip");
    strip.arg(&stripped);
    run_checked(strip)?;
    let common = bundle.join(COMMON_DIR).join(COMMON_LIB);
    std::fs::create_dir_all(bundle.join(COMMON_DIR))?;
    std::fs::copy(common_library(root)?, &common).context("cannot copy libllama-common")?;
    let mut strip = Command::new("strip");
    strip.arg("--strip-unneeded").arg(&common);
    run_checked(strip)?;

    let carried = dir_bytes(&bundle)?;
    let tree = worktree_bytes(&repo)?;
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!();
    eprintln!("carried folder {}:", bundle.display());
    for entry in std::fs::read_dir(&bundle)? {
        let entry = entry?;
        eprintln!("  {:>8.2} MiB  {}", mib(entry.metadata()?.len()), entry.file_name().display());
    }
    eprintln!(
        "total {:.2} MiB carried + {:.2} MiB working tree of {} = {:.2} MiB (limit {:.0} MiB)",
        mib(carried),
        mib(tree),
        repo.display(),
        mib(carried + tree),
        mib(CARRY_LIMIT)
    );
    if carried + tree > CARRY_LIMIT {
        bail!(
            "the device tool carries at most 64 MiB; this would send {:.2} MiB",
            mib(carried + tree)
        );
    }
    let command = format!("bash {}/run.sh", relative.display());
    eprintln!();
    eprintln!("device command (run from the repository root {}):", repo.display());
    println!("{command}");
    eprintln!("carry: [\"{}\"]   timeout_s: {DEVICE_TIMEOUT_S}", relative.display());
    eprintln!("then: cargo xtask gpu-check --report <files_at>/gpu-check.json");
    Ok(())
}

/// `cargo xtask gpu-check --dry-run`: the same script against the fake NVML and the CPU
/// `llama-server`, then the report asserted. `hangard` defaults to the debug build.
pub(crate) fn dry_run(root: &Path, hangard: Option<PathBuf>) -> Result<()> {
    deps::ensure()?;
    let python = venv::ensure_bridge(root)?; // numpy, as on the device
    let llama = llama_server::ensure(root)?;
    let hangard = match hangard {
        Some(path) => std::path::absolute(path)?,
        None => {
            let mut build = cargo(root);
            build.args(["build", "--locked", "-p", "hangard"]);
            run_checked(build)?;
            crate::target_dir(root)?.join("debug").join("hangard")
        }
    };
    let tarball = trimmed_tree(root)?;
    let dir = crate::target_dir(root)?.join("gpu-check").join("dry-run");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let bundle = dir.join("bundle");
    fill(root, &bundle, &tarball)?;
    let nvml = hangar_gpu::fake::build(&dir.join("nvml")).context("cannot build the fake NVML")?;
    let script = nvml.with_file_name("nvml-script");
    let registry = dir.join("gpu-processes");
    let fakes = root.join("xtask/gpu-check/dry-run");
    let driver = Driver::start(&python, &fakes.join("fake_gpu.py"), &script, &registry)?;

    let out = dir.join("out");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![fakes.clone()];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("bash");
    cmd.arg(bundle.join("run.sh"))
        .env("OUT", &out)
        .env("PATH", std::env::join_paths(paths)?)
        .env("GPU_CHECK_MODE", "dry_run")
        .env("GPU_CHECK_WORK", dir.join("work"))
        .env("GPU_CHECK_PYTHON", &python)
        .env("GPU_CHECK_DEADLINE_S", DRY_RUN_DEADLINE_S)
        .env("GPU_CHECK_HANGARD", &hangard)
        .env("GPU_CHECK_LLAMA_SERVER", fakes.join("llama-server"))
        .env("GPU_CHECK_GGUF_ARGS", DRY_RUN_GGUF)
        .env("GPU_CHECK_CHILD_PASS_ENV", "GPU_CHECK_FAKE_*")
        .env("GPU_CHECK_FAKE_NVML_SCRIPT", &script)
        .env("GPU_CHECK_FAKE_GPU_DIR", &registry)
        .env("GPU_CHECK_FAKE_REAL_SERVER", &llama)
        .env(hangar_gpu::NVML_LIBRARY_ENV, &nvml);
    eprintln!("$ OUT={} bash {}", out.display(), bundle.join("run.sh").display());
    let status = cmd.status().context("cannot start bash")?;
    drop(driver);
    let report = out.join("gpu-check.json");
    let mut problems = report::verify_file(&report, report::Mode::DryRun)?;
    problems.extend(report::out_limits(&out)?);
    if !status.success() {
        problems.push(format!("run.sh: {status}"));
    }
    if !problems.is_empty() {
        bail!("the dry run failed ({}):\n  {}", report.display(), problems.join("\n  "));
    }
    eprintln!("gpu-check dry run passed: {}", report.display());
    Ok(())
}

/// `cargo xtask gpu-check --report FILE`: asserts a device report.
pub(crate) fn verify(file: &Path) -> Result<()> {
    let problems = report::verify_file(file, report::Mode::Device)?;
    if !problems.is_empty() {
        bail!("{}:\n  {}", file.display(), problems.join("\n  "));
    }
    eprintln!("{}: every phase and check passed, every figure present", file.display());
    Ok(())
}

/// The dry run's pretend driver process; killed when dropped.
struct Driver(Child);

impl Driver {
    fn start(python: &Path, driver: &Path, script: &Path, registry: &Path) -> Result<Self> {
        let (used, total, name) = FAKE_GPU;
        let mut cmd = Command::new(python);
        cmd.arg(driver).arg(script).arg(registry).args([used, total, name]);
        let child = Self(cmd.stdin(Stdio::null()).spawn().context("cannot start fake_gpu.py")?);
        let started = Instant::now();
        while !script.exists() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!("fake_gpu.py wrote no {} in 10 s", script.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `bundle` holds the scripts and the trimmed tree (emptied first).
fn fill(root: &Path, bundle: &Path, tarball: &Path) -> Result<()> {
    if bundle.exists() {
        std::fs::remove_dir_all(bundle)
            .with_context(|| format!("cannot clear {}", bundle.display()))?;
    }
    std::fs::create_dir_all(bundle)?;
    for script in SCRIPTS {
        let from = root.join("xtask/gpu-check").join(script);
        std::fs::copy(&from, bundle.join(script))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }
    std::fs::copy(tarball, bundle.join(TARBALL)).context("cannot copy the llama.cpp tarball")?;
    Ok(())
}

/// The release `hangard` whose in-process engine links llama.cpp's shared libraries, found
/// at run time: on the device, those the build phase makes with CUDA from the carried tree.
/// That tree (`llama-cpp-python`'s) is another llama.cpp commit than `llama-cpp-sys-2`'s,
/// with the same `llama.h`; `ggml-backend.h` only adds two functions, which Hangard does not
/// call (a missing symbol stops `hangard` at start: Rust links with `-z now`).
fn release_hangard(root: &Path) -> Result<PathBuf> {
    let mut build = cargo(root);
    build.args(["build", "--locked", "--release", "-p", "hangard", "--no-default-features"]);
    build.args(["--features", "llama-cpp-shared"]);
    run_checked(build)?;
    Ok(crate::target_dir(root)?.join("release").join("hangard"))
}

/// `llama-cpp-sys-2`'s `libllama-common` of the newest `dynamic-link` release build (the
/// one [`release_hangard`] linked against).
fn common_library(root: &Path) -> Result<PathBuf> {
    let build = crate::target_dir(root)?.join("release").join("build");
    let mut found = Vec::new();
    for entry in
        std::fs::read_dir(&build).with_context(|| format!("cannot read {}", build.display()))?
    {
        let dir = entry?.path();
        if !dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("llama-cpp-sys-2-")) {
            continue;
        }
        let lib = dir.join("out").join("lib").join(COMMON_LIB);
        if let Ok(modified) = lib.metadata().and_then(|m| m.modified()) {
            found.push((modified, lib));
        }
    }
    found.sort();
    found
        .pop()
        .map(|(_, lib)| lib)
        .with_context(|| format!("no {COMMON_LIB} of llama-cpp-sys-2 under {}", build.display()))
}

/// `<target>/gpu-check/llama.cpp-<version>.tar.gz`: the sdist's `vendor/llama.cpp` without
/// [`TRIM`], as `llama.cpp/…` (rebuilt every time from the cached sdist: a few seconds).
fn trimmed_tree(root: &Path) -> Result<PathBuf> {
    let dir = crate::target_dir(root)?.join("gpu-check");
    let sdist = llama_server::sdist(&dir)?;
    let prefix = format!("llama_cpp_python-{}/vendor/llama.cpp", crate::llama_server::LCP_VERSION);
    let unpacked = dir.join("trim");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)?;
    }
    std::fs::create_dir_all(&unpacked)?;
    let mut untar = Command::new("tar");
    untar.arg("-xzf").arg(&sdist).arg("-C").arg(&unpacked);
    untar.args(["--anchored", "--no-wildcards-match-slash"]);
    untar.args(TRIM.iter().map(|t| format!("--exclude={prefix}/{t}")));
    untar.arg(&prefix);
    run_checked(untar)?;
    let tarball = dir.join(format!("llama.cpp-{}.tar.gz", crate::llama_server::LCP_VERSION));
    let mut pack = Command::new("tar");
    pack.arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(unpacked.join(&prefix).join(".."))
        .arg("llama.cpp");
    run_checked(pack)?;
    std::fs::remove_dir_all(&unpacked)?;
    Ok(tarball)
}

fn git(repo: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(repo);
    cmd
}

fn git_toplevel(dir: &Path) -> Result<PathBuf> {
    let out = git(dir).args(["rev-parse", "--show-toplevel"]).output()?;
    if !out.status.success() {
        bail!("{} is not in a git repository", dir.display());
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn git_ignores(repo: &Path, relative: &Path) -> Result<bool> {
    let status = git(repo).args(["check-ignore", "-q"]).arg(relative.join("run.sh")).status()?;
    Ok(status.success())
}

/// Bytes of the files the device tool sends of `repo`: tracked ones and untracked ones git
/// does not ignore.
fn worktree_bytes(repo: &Path) -> Result<u64> {
    let out = git(repo)
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .output()?;
    if !out.status.success() {
        bail!("git ls-files failed in {}", repo.display());
    }
    let names = String::from_utf8(out.stdout)?;
    let mut seen = std::collections::BTreeSet::new();
    Ok(names
        .split('\0')
        .filter(|n| !n.is_empty() && seen.insert(*n))
        .filter_map(|n| std::fs::symlink_metadata(repo.join(n)).ok())
        .map(|m| m.len())
        .sum())
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}
