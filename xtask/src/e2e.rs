//! `cargo xtask e2e`: the demo server driven by real clients.
//!
//! 1. A virtualenv in `target/e2e-venv` (created once; `python3-venv` is installed with
//!    apt when `python3 -m venv` cannot work and we are root) with the packages of
//!    `xtask/e2e/requirements.txt` (installed only when they do not import yet).
//! 2. `hangard serve --config fixtures/demo --port 0`, built first by `cargo test --workspace
//!    --locked --no-run` (the build of `cargo xtask test`, so llama.cpp is compiled once for
//!    both; cmake and libclang are checked first as for `cargo xtask test`, and `llama-server`
//!    for the demo's `tiny-llama-server` is built when missing, as by `cargo xtask
//!    llama-server`); the address comes from its `hangard listening on …` line, readiness
//!    from `GET /readyz` (every enabled model loaded: the stub models, the llama.cpp GGUF
//!    models and the `llama-server` model alike).
//! 3. Each script of `xtask/e2e` with `HANGAR_URL` (and `HANGARD`, the binary) set; each asserts and exits non-zero on
//!    failure. Every script runs even when one fails. `workbench.py` drives `/ui` in Debian's
//!    headless `chromium` (installed with apt when missing and root, see
//!    [`deps::ensure_chromium`]) through Playwright, and saves its screenshots to
//!    `target/e2e-screenshots` (`HANGAR_SCREENSHOTS` names another directory).
//! 4. Schemathesis (`st run`, see [`schemathesis`]) against the live `/openapi.json`: every
//!    check, every phase (examples, coverage, fuzzing, stateful), a fixed seed, no example
//!    database and no failure cache (`xtask/e2e/schemathesis.toml`), so CI repeats the same
//!    cases. Its reports (JUnit XML, JSON) go to `target/e2e-schemathesis/<run>/`.
//! 5. SIGTERM to the server, which must drain and exit 0. Then a small server on `[::1]`
//!    (one stub model) for `workbench_hosts.py`: the workbench through `[::1]` and
//!    `localhost` (the main run covers `127.0.0.1`), and a name the browser resolves to
//!    it, as DNS rebinding would, refused with 403.
//! 6. A second server on the demo config with `--admin-api-key <random key>` and
//!    `--inference-api-key <another>`: the keyed scripts, then schemathesis
//!    again, with the key as a bearer token, and the same SIGTERM check; then a report.
//!    Every step is a row of the report; any failed row fails the run.
//! 7. `cargo xtask gpu-check --dry-run` with the same `hangard`: the GPU check's script
//!    against the fake NVML and the CPU `llama-server`, its report asserted.
//! 8. The cluster: `deploy_manifests.py` renders `deploy/` with `kubectl kustomize` (checked
//!    first, see [`deps::ensure_kubectl`]) and validates every object; `multi_host.py` runs
//!    three `hangard` hosts in network namespaces behind `vllm-router`, kills one, and counts
//!    how every request ended. Where namespaces cannot be made it exits 77 and its row says
//!    SKIPPED, with a warning at the end of the report.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::venv::{ensure_venv, quiet};
use crate::{cargo, deps, llama_server, run as run_checked};

/// The client scripts, in the order they run.
const SCRIPTS: [&str; 6] = [
    "openai_client.py",
    "anthropic_client.py",
    "triton_client.py",
    "triton_grpc.py",
    "validate_openapi.py",
    "workbench.py",
];
/// The scripts run again against the server with an admin key and an inference key
/// (`HANGAR_ADMIN_KEY` and `HANGAR_INFERENCE_KEY` set): gRPC with its metadata, the workbench
/// asking for the key, and the Anthropic SDK sending its `x-api-key`.
const KEYED_SCRIPTS: [&str; 3] = ["triton_grpc.py", "workbench.py", "anthropic_client.py"];
/// What the scripts import; when all import, nothing is installed.
const IMPORTS: &str = "import openai, anthropic, tritonclient.http, tritonclient.grpc, openapi_spec_validator, \
                       schemathesis, playwright.sync_api, kubernetes_validate, vllm_router";
/// The exit status of a script that could not run here (the multi-host test without
/// network namespaces).
const SKIPPED: i32 = 77;
const LISTENING: &str = "hangard listening on ";
/// Schemathesis's seed: the same cases on every run.
const SCHEMATHESIS_SEED: u64 = 20_240_611;
/// Cases per operation and phase; with about 30 operations this keeps one run to a few
/// minutes on 2 cores.
const SCHEMATHESIS_MAX_EXAMPLES: u32 = 20;
/// Seconds one request of schemathesis may take (the llama.cpp models generate on the CPU).
const SCHEMATHESIS_REQUEST_TIMEOUT_S: u32 = 30;
/// A schemathesis run still going after this is killed and counts as failed.
const SCHEMATHESIS_LIMIT: Duration = Duration::from_secs(10 * 60);

/// One finished step of the run: name, passed, detail, duration.
type Check = (String, bool, String, Duration);

pub(crate) fn run(root: &Path) -> Result<()> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let python = ensure_venv(&target.join("e2e-venv"))?;
    ensure_packages(&python, &root.join("xtask/e2e/requirements.txt"))?;

    deps::ensure()?;
    deps::ensure_chromium()?;
    deps::ensure_kubectl()?;
    deps::ensure_iproute2()?;
    llama_server::ensure(root)?;
    crate::trained::ensure(root)?;
    crate::venv::ensure_bridge(root)?;
    run_checked(test_build(root))?;
    let binary = target.join("debug").join("hangard");

    let log_path = target.join("e2e-hangard.log");
    let grpc = free_port()?.to_string();
    let mut server = DemoServer::start(root, &binary, &log_path, &["--grpc-port", &grpc])?;
    eprintln!("hangard listening on {} (log: {})", server.base, log_path.display());
    server.wait_ready(Duration::from_secs(60))?;

    let st = python.with_file_name("st");
    let reports = target.join("e2e-schemathesis");
    let mut results: Vec<Check> = Vec::new();
    for script in SCRIPTS {
        results.push(run_script(root, &python, script, &server.base, &grpc, None, &binary)?);
    }
    let open_reports = reports.join("no-admin-key");
    results.push(run_schemathesis(
        "schemathesis, no admin key",
        schemathesis(root, &st, &server.base, None, &open_reports),
        &open_reports,
    )?);
    results.push(server.stop("hangard drains and exits 0 on SIGTERM"));
    results.extend(workbench_hosts(root, &python, &target)?);

    let key = random_key()?;
    let inference_key = random_key()?;
    let key_log_path = target.join("e2e-hangard-admin-key.log");
    let grpc = free_port()?.to_string();
    let args =
        ["--admin-api-key", &key, "--inference-api-key", &inference_key, "--grpc-port", &grpc];
    let mut server = DemoServer::start(root, &binary, &key_log_path, &args)?;
    eprintln!(
        "hangard with an admin key listening on {} (log: {})",
        server.base,
        key_log_path.display()
    );
    server.wait_ready(Duration::from_secs(60))?;
    for script in KEYED_SCRIPTS {
        let keys = Some((key.as_str(), inference_key.as_str()));
        results.push(run_script(root, &python, script, &server.base, &grpc, keys, &binary)?);
    }
    let key_reports = reports.join("admin-key");
    results.push(run_schemathesis(
        "schemathesis, with the admin key",
        schemathesis(root, &st, &server.base, Some(&key), &key_reports),
        &key_reports,
    )?);
    results.push(server.stop("hangard (admin key) drains and exits 0 on SIGTERM"));
    results.push(gpu_check_dry_run(root, &binary));
    results.extend(cluster(root, &python, &binary, &target)?);

    eprintln!();
    eprintln!("e2e results:");
    for (name, ok, detail, took) in &results {
        let mark = if *ok { "ok  " } else { "FAIL" };
        eprintln!("  {mark}  {name}  ({detail}, {:.1}s)", took.as_secs_f64());
    }
    let failed = results.iter().filter(|r| !r.1).count();
    if failed > 0 {
        bail!(
            "{failed} e2e check(s) failed; server logs: {} and {}",
            log_path.display(),
            key_log_path.display()
        );
    }
    for (name, _, detail, _) in results.iter().filter(|r| r.2.starts_with("SKIPPED")) {
        eprintln!("WARNING: {name} did not run: {detail}");
    }
    eprintln!("all {} e2e checks passed", results.len());
    Ok(())
}

/// The GPU check's dry run as one row.
fn gpu_check_dry_run(root: &Path, hangard: &Path) -> Check {
    let started = Instant::now();
    let name = "gpu-check --dry-run (fake NVML, CPU llama-server)".to_owned();
    match crate::gpu_check::dry_run(root, Some(hangard.to_path_buf())) {
        Ok(()) => (name, true, "report asserted".into(), started.elapsed()),
        Err(e) => (name, false, format!("{e:#}"), started.elapsed()),
    }
}

/// `deploy_manifests.py` and `multi_host.py` (step 8), each a row; a skipped multi-host
/// test is a row that passes and says SKIPPED.
fn cluster(root: &Path, python: &Path, binary: &Path, target: &Path) -> Result<Vec<Check>> {
    let models = crate::trained::dir(root)?;
    let mut checks = Vec::new();
    for script in ["deploy_manifests.py", "multi_host.py"] {
        let started = Instant::now();
        eprintln!("$ {} xtask/e2e/{script}", python.display());
        let status = Command::new(python)
            .arg(root.join("xtask/e2e").join(script))
            .env("HANGARD", binary)
            .env("HANGAR_TRAINED_MODELS", &models)
            .env("HANGAR_E2E_LOGS", target)
            .current_dir(root)
            .status()
            .with_context(|| format!("cannot run {script}"))?;
        let (ok, detail) = if status.code() == Some(SKIPPED) {
            (true, "SKIPPED: network namespaces cannot be made here (its output says why)".into())
        } else {
            (status.success(), status.to_string())
        };
        checks.push((script.to_owned(), ok, detail, started.elapsed()));
    }
    Ok(checks)
}

/// `workbench_hosts.py` against a server on `[::1]` with one stub model: the workbench
/// through each loopback name, and a rebound name refused.
fn workbench_hosts(root: &Path, python: &Path, target: &Path) -> Result<[Check; 2]> {
    let config = target.join("e2e-hosts-config");
    std::fs::create_dir_all(&config)?;
    let settings = r#"{ "models": { "chat": { "backend": "stub" } } }"#;
    std::fs::write(config.join("settings.json"), settings)?;
    let binary = target.join("debug").join("hangard");
    let log_path = target.join("e2e-hangard-hosts.log");
    let (child, base) = spawn_serve(&binary, &config, &["--host", "::1"], root, &log_path)?;
    let mut server = DemoServer { child, base, exited: false };
    let check = run_script(root, python, "workbench_hosts.py", &server.base, "0", None, &binary)?;
    Ok([check, server.stop("hangard on [::1] drains and exits 0 on SIGTERM")])
}

/// Runs `xtask/e2e/<script>` against the server at `base` (gRPC on `grpc_port`), with
/// `HANGAR_ADMIN_KEY` and `HANGAR_INFERENCE_KEY` when `keys` (admin, inference) are given; a
/// row of the report.
fn run_script(
    root: &Path,
    python: &Path,
    script: &str,
    base: &str,
    grpc_port: &str,
    keys: Option<(&str, &str)>,
    binary: &Path,
) -> Result<Check> {
    let started = Instant::now();
    let shown_key =
        if keys.is_some() { "HANGAR_ADMIN_KEY=… HANGAR_INFERENCE_KEY=… " } else { "" };
    eprintln!("$ {shown_key}{} xtask/e2e/{script}", python.display());
    let mut cmd = Command::new(python);
    cmd.arg(root.join("xtask/e2e").join(script))
        .env("HANGAR_URL", base)
        .env("HANGAR_GRPC_URL", format!("127.0.0.1:{grpc_port}"))
        .env("HANGARD", binary)
        .current_dir(root);
    if let Some((admin, inference)) = keys {
        cmd.env("HANGAR_ADMIN_KEY", admin).env("HANGAR_INFERENCE_KEY", inference);
    }
    let status = cmd.status().with_context(|| format!("cannot run {script}"))?;
    let name = if keys.is_some() { format!("{script}, with the keys") } else { script.to_owned() };
    Ok((name, status.success(), status.to_string(), started.elapsed()))
}

/// The `st run` command line of one schemathesis run against `base` (the key, when given,
/// as a bearer token), its reports written to `report_dir`. Every option of the runs is set
/// here, but for what only a config file can say (`xtask/e2e/schemathesis.toml`: no
/// `.schemathesis/` cache).
fn schemathesis(
    root: &Path,
    st: &Path,
    base: &str,
    key: Option<&str>,
    report_dir: &Path,
) -> Command {
    let mut cmd = Command::new(st);
    cmd.arg("--config-file").arg(root.join("xtask/e2e/schemathesis.toml"));
    cmd.arg("run").arg(format!("{base}/openapi.json"));
    cmd.args(["--checks", "all"]);
    // ST302: the only route that creates a resource is a lease, and an unload the stateful
    // phase runs in between revokes it by design (404 lease_not_found is the documented
    // answer). The config file cannot turn a check off against `--checks all`.
    cmd.args(["--exclude-checks", "ensure_resource_availability"]);
    cmd.args(["--phases", "examples,coverage,fuzzing,stateful"]);
    cmd.args(["--seed", &SCHEMATHESIS_SEED.to_string()]);
    // A stored example database would make the next run differ from this one.
    cmd.args(["--generation-database", "none"]);
    cmd.args(["--max-examples", &SCHEMATHESIS_MAX_EXAMPLES.to_string()]);
    // One worker: the same request order every run, and the server keeps the other core.
    cmd.args(["--workers", "1"]);
    cmd.args(["--request-timeout", &SCHEMATHESIS_REQUEST_TIMEOUT_S.to_string()]);
    if let Some(key) = key {
        cmd.arg("--header").arg(format!("Authorization: Bearer {key}"));
    }
    cmd.args(["--report", "junit,json"]).arg("--report-dir").arg(report_dir);
    cmd.arg("--no-color");
    cmd.current_dir(root);
    cmd
}

/// Runs one schemathesis command, killed after [`SCHEMATHESIS_LIMIT`]; a row of the report.
fn run_schemathesis(name: &str, mut cmd: Command, report_dir: &Path) -> Result<Check> {
    let _ = std::fs::remove_dir_all(report_dir);
    eprintln!("$ {cmd:?}");
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("cannot start {cmd:?}"))?;
    let (ok, detail) = loop {
        if let Some(status) = child.try_wait()? {
            break (status.success(), status.to_string());
        }
        if started.elapsed() >= SCHEMATHESIS_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break (false, format!("killed after {SCHEMATHESIS_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("schemathesis reports (JUnit XML, JSON): {}", report_dir.display());
    let detail = format!("{detail}; reports in {}", report_dir.display());
    Ok((name.to_owned(), ok, detail, started.elapsed()))
}

/// A fresh admin key: 16 random bytes from the OS, hex-encoded.
fn random_key() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `cargo xtask test`'s command (`crate::test`: `cargo test --workspace --locked`) with
/// `--no-run`: the same units as the tests, `target/debug/hangard` among them (built for
/// `bins/hangard/tests`), so after `cargo xtask test` it is a no-op. `cargo build -p hangard`
/// is not: cargo builds build dependencies without debuginfo unless they are shared with a
/// normal dependency, which depends on the packages and targets selected, so llama-cpp-sys-2's
/// build script gets another hash and llama.cpp is compiled once more (about 10 minutes on 2
/// cores). Keep the arguments in step with `crate::test`.
fn test_build(root: &Path) -> Command {
    let mut cmd = cargo(root);
    cmd.args(["test", "--workspace", "--locked", "--no-run"]);
    cmd
}

/// Installs the client packages unless they already import.
fn ensure_packages(python: &Path, requirements: &Path) -> Result<()> {
    if quiet(Command::new(python).args(["-c", IMPORTS])) {
        return Ok(());
    }
    let mut pip = Command::new(python);
    pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet", "-r"]);
    pip.arg(requirements);
    run_checked(pip)?;
    if !quiet(Command::new(python).args(["-c", IMPORTS])) {
        bail!("the e2e packages were installed but do not import: `{IMPORTS}` fails");
    }
    Ok(())
}

/// `hangard serve` on the demo config. Killed on drop if still running.
struct DemoServer {
    child: Child,
    base: String,
    exited: bool,
}

/// Starts `binary serve --config <config> --port 0 <args>` in `cwd` (stderr to `log_path`, no
/// admin key or config from the environment) and waits for its `hangard listening on …`
/// line; returns the child and the base URL. Shared by the e2e run and the llama.cpp
/// benchmark.
pub(crate) fn spawn_serve(
    binary: &Path,
    config: &Path,
    args: &[&str],
    cwd: &Path,
    log_path: &Path,
) -> Result<(Child, String)> {
    let log = std::fs::File::create(log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut child = Command::new(binary)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(["--port", "0"])
        .args(args)
        .current_dir(cwd)
        .env_remove("HANGAR_ADMIN_KEY")
        .env_remove("HANGAR_CONFIG")
        // No gRPC listener unless the args ask for one (`--grpc-port` wins).
        .env("HANGAR_GRPC_PORT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut line = String::new();
    let base = loop {
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            let status = child.wait()?;
            bail!("hangard exited ({status}) before listening; see {}", log_path.display());
        }
        if let Some(url) = line.trim_end().strip_prefix(LISTENING) {
            break url.to_owned();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Ok((child, base))
}

impl DemoServer {
    fn start(root: &Path, binary: &Path, log_path: &Path, args: &[&str]) -> Result<Self> {
        std::fs::create_dir_all(root.join(crate::DEMO_REPOSITORY))?;
        let (child, base) = spawn_serve(binary, Path::new("fixtures/demo"), args, root, log_path)?;
        Ok(Self { child, base, exited: false })
    }

    /// Polls `GET /readyz` (every enabled model loaded) until 200 or the deadline.
    fn wait_ready(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(20);
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .new_agent();
        let url = format!("{}/readyz", self.base);
        loop {
            let answer = agent.get(&url).call().map(|mut response| {
                let _ = response.body_mut().read_to_vec();
                response.status().as_u16()
            });
            match answer {
                Ok(200) => return Ok(()),
                Ok(_) | Err(_) if Instant::now() < deadline => {}
                Ok(status) => bail!("GET /readyz still answers {status} after {limit:?}"),
                Err(e) => bail!("GET /readyz fails after {limit:?}: {e}"),
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// SIGTERM, then the exit status checked as the report row `name`.
    fn stop(&mut self, name: &str) -> Check {
        let started = Instant::now();
        let (ok, detail) = match self.terminate(Duration::from_secs(20)) {
            Ok(status) if status.success() => (true, "exit status 0".to_owned()),
            Ok(status) => (false, status.to_string()),
            Err(e) => (false, format!("{e:#}")),
        };
        (name.to_owned(), ok, detail, started.elapsed())
    }

    /// SIGTERM, then waits for the exit; SIGKILL after `grace`.
    fn terminate(&mut self, grace: Duration) -> Result<ExitStatus> {
        let pid = self.child.id().to_string();
        run_checked({
            let mut kill = Command::new("kill");
            kill.args(["-TERM", &pid]);
            kill
        })?;
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.exited = true;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("hangard did not exit within {grace:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a port")?;
    Ok(listener.local_addr()?.port())
}
