//! `cargo xtask fuzz [--target T] [--secs N]`: coverage-guided fuzzing of what Hangar reads
//! from outside, with libFuzzer (the `libfuzzer-sys` crate from crates.io).
//!
//! 1. Seeds, written anew each run into `fuzz/corpus/<target>/seed-*`: a tiny GGUF model
//!    (this crate's fixture writer) and safetensors file, the demo and invalid configs of
//!    `fixtures/`, request bodies for every route, event ids.
//! 2. The targets of `fuzz/` (one binary per `hangar_fuzz::TARGETS` entry, each calling its
//!    check) are built on the stable toolchain with the flags `cargo fuzz` uses: LLVM's
//!    SanitizerCoverage (inline 8-bit counters, PC table, compare tracing) and
//!    AddressSanitizer, the latter through `RUSTC_BOOTSTRAP=1` (`-Zsanitizer` is unstable),
//!    into `target/fuzz`.
//! 3. Each target runs `--secs` seconds (two at a time: one per core here) on a scratch
//!    copy of its corpus, with inputs up to 4 KiB and a 512 MiB allocation limit (a header
//!    count that drives an unchecked allocation is a finding). Its corpus is then minimized
//!    (`-merge=1`) back into `fuzz/corpus/<target>`; a crash lands in
//!    `fuzz/regressions/<target>/`, which the ordinary tests replay forever after.
//! 4. Per target: executions, coverage (edges) and features, corpus size, crashes; the
//!    libFuzzer logs are in `target/fuzz/logs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::fixtures::gguf::Gguf;

/// The fuzz targets, as `crates/hangar-fuzz` names them.
pub(crate) const TARGETS: [&str; 9] = [
    "gguf",
    "gguf_shape",
    "safetensors",
    "digest",
    "config",
    "folder",
    "bodies",
    "event_id",
    "grpc",
];

/// The target triple the instrumented binaries are built for (build scripts and proc
/// macros stay uninstrumented, as with `cargo fuzz`).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// `cargo fuzz`'s flags for libFuzzer with AddressSanitizer.
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Zsanitizer=address -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers";

/// One target's run, as libFuzzer reported it.
#[derive(Debug, Default)]
struct Outcome {
    runs: u64,
    edges: u64,
    features: u64,
    corpus: usize,
    crashes: usize,
    ok: bool,
}

/// Seeds, build, fuzz each of `targets` for `secs` seconds, minimize, report.
pub(crate) fn run(root: &Path, target: Option<&str>, secs: u64) -> Result<()> {
    let targets: Vec<&str> = match target {
        Some(t) if TARGETS.contains(&t) => vec![t],
        Some(t) => bail!("no fuzz target `{t}`; the targets: {}", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    for t in &targets {
        write_seeds(root, t)?;
    }
    let bin_dir = build(root)?;
    let logs = root.join("target/fuzz/logs");
    std::fs::create_dir_all(&logs)?;
    let mut outcomes = Vec::new();
    for pair in targets.chunks(2) {
        let running: Vec<(&str, Child)> = pair
            .iter()
            .map(|t| Ok((*t, start(root, &bin_dir, t, secs, &logs)?)))
            .collect::<Result<_>>()?;
        for (t, mut child) in running {
            let status = child.wait().with_context(|| format!("waiting for {t}"))?;
            let log = std::fs::read_to_string(logs.join(format!("{t}.log"))).unwrap_or_default();
            let mut outcome = parse(&log);
            outcome.ok = status.success();
            minimize(root, &bin_dir, t, &logs)?;
            outcome.corpus = count(&root.join("fuzz/corpus").join(t));
            outcome.crashes = count(&root.join("fuzz/regressions").join(t));
            outcomes.push((t, outcome));
        }
    }
    let mut table = String::from("target        runs        edges  features  corpus  crashes\n");
    for (t, o) in &outcomes {
        let _ = writeln!(
            table,
            "{t:<12} {:>10} {:>8} {:>9} {:>7} {:>8}{}",
            o.runs,
            o.edges,
            o.features,
            o.corpus,
            o.crashes,
            if o.ok { "" } else { "  <- the fuzzer stopped on a finding" }
        );
    }
    print!("{table}");
    if outcomes.iter().any(|(_, o)| !o.ok) {
        bail!("a target found a crash: see fuzz/regressions and target/fuzz/logs");
    }
    Ok(())
}

/// Builds the targets; the directory of the binaries.
fn build(root: &Path) -> Result<PathBuf> {
    let target_dir = root.join("target/fuzz");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root.join("fuzz"))
        .args(["build", "--release", "--bins", "--target", TRIPLE, "--target-dir"])
        .arg(&target_dir)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", RUSTFLAGS)
        .status()
        .context("cannot run cargo build for fuzz/")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    Ok(target_dir.join(TRIPLE).join("release"))
}

/// Starts target `t` on a scratch copy of its corpus, its output into `logs/<t>.log`.
fn start(root: &Path, bin_dir: &Path, t: &str, secs: u64, logs: &Path) -> Result<Child> {
    let grow = root.join("target/fuzz/grow").join(t);
    let _ = std::fs::remove_dir_all(&grow);
    std::fs::create_dir_all(&grow)?;
    let regressions = root.join("fuzz/regressions").join(t);
    std::fs::create_dir_all(&regressions)?;
    let log = std::fs::File::create(logs.join(format!("{t}.log")))?;
    eprintln!("fuzzing {t} for {secs} s");
    Command::new(bin_dir.join(t))
        .arg(format!("-max_total_time={secs}"))
        .args(["-max_len=4096", "-rss_limit_mb=2048", "-malloc_limit_mb=512", "-timeout=20"])
        .args(["-print_final_stats=1", "-close_fd_mask=1"])
        .arg(format!("-artifact_prefix={}/", regressions.display()))
        .arg(&grow)
        .arg(root.join("fuzz/corpus").join(t))
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start the {t} target"))
}

/// Merges the corpus and what the run added into a minimal set that keeps every feature,
/// which replaces `fuzz/corpus/<t>`.
fn minimize(root: &Path, bin_dir: &Path, t: &str, logs: &Path) -> Result<()> {
    let corpus = root.join("fuzz/corpus").join(t);
    let merged = root.join("target/fuzz/merged").join(t);
    let _ = std::fs::remove_dir_all(&merged);
    std::fs::create_dir_all(&merged)?;
    let log = std::fs::File::create(logs.join(format!("{t}.merge.log")))?;
    let status = Command::new(bin_dir.join(t))
        .args(["-merge=1", "-max_len=4096", "-rss_limit_mb=2048", "-malloc_limit_mb=512"])
        .arg(&merged)
        .arg(&corpus)
        .arg(root.join("target/fuzz/grow").join(t))
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .stdout(Stdio::null())
        .stderr(log)
        .status()?;
    if !status.success() || count(&merged) == 0 {
        bail!("minimizing the {t} corpus failed: see target/fuzz/logs/{t}.merge.log");
    }
    std::fs::remove_dir_all(&corpus)?;
    std::fs::create_dir_all(&corpus)?;
    for entry in std::fs::read_dir(&merged)? {
        let entry = entry?;
        std::fs::copy(entry.path(), corpus.join(entry.file_name()))?;
    }
    Ok(())
}

/// Executions, edges and features from a libFuzzer log (its last status line and final
/// stats).
fn parse(log: &str) -> Outcome {
    let mut outcome = Outcome::default();
    let after = |line: &str, key: &str| {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace().next()?.parse::<u64>().ok()
    };
    for line in log.lines() {
        if line.starts_with('#') {
            outcome.edges = after(line, "cov: ").unwrap_or(outcome.edges);
            outcome.features = after(line, "ft: ").unwrap_or(outcome.features);
        }
        if let Some(n) = after(line, "stat::number_of_executed_units: ") {
            outcome.runs = n;
        }
    }
    outcome
}

/// Files in `dir` (none when it does not exist).
fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().filter(|e| e.path().is_file()).count())
}

/// Writes target `t`'s seeds into `fuzz/corpus/<t>/seed-<name>`.
fn write_seeds(root: &Path, t: &str) -> Result<()> {
    let dir = root.join("fuzz/corpus").join(t);
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in seeds(root, t)? {
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    Ok(())
}

/// `hangar.json` files for the `folder` target: one that holds, paths out of the folder and
/// through its link, flag-like names, capped, operator and unlisted fields, malformed ones.
const FOLDER_SEEDS: [&str; 12] = [
    "{}",
    r#"{"model_path": "m.gguf", "gguf_n_ctx": 4096}"#,
    r#"{"model_path": "out/passwd"}"#,
    r#"{"model_path": "../m/m.gguf"}"#,
    r#"{"aliases": ["--api-key", "a,b"]}"#,
    r#"{"replicas": 2, "target_inflight": 4}"#,
    r#"{"pinned": true}"#,
    r#"{"backend": "vllm_serve", "vllm_model": "/etc"}"#,
    r#"{"backend": "llama_server", "llama_server_mmproj": "w/weights.bin", "llama_server_draft_model": "w"}"#,
    "[]",
    r#"{"adapters": []}"#,
    "{ not json",
];

/// The seeds of target `t`, by name.
pub(crate) fn seeds(root: &Path, t: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let seeds = match t {
        "gguf" | "gguf_shape" => vec![("tiny-llama".into(), tiny_gguf())],
        "digest" => vec![("gguf".into(), tiny_gguf()), ("safetensors".into(), tiny_safetensors())],
        "safetensors" => vec![("tiny".into(), tiny_safetensors())],
        "config" => config_seeds(root)?,
        "folder" => FOLDER_SEEDS
            .iter()
            .enumerate()
            .map(|(i, seed)| ((i + 1).to_string(), seed.as_bytes().to_vec()))
            .collect(),
        "bodies" => body_seeds(),
        "event_id" => ["1-2", "0-0", "18446744073709551615-1", "1-", "-1", "+1-2", "a-b", ""]
            .iter()
            .enumerate()
            .map(|(i, id)| (i.to_string(), id.as_bytes().to_vec()))
            .collect(),
        "grpc" => grpc_seeds(),
        other => bail!("no seeds for `{other}`"),
    };
    Ok(seeds)
}

/// A llama-architecture GGUF with the keys `gguf_shape` reads and two small tensors.
fn tiny_gguf() -> Vec<u8> {
    let mut g = Gguf::default();
    g.str("general.architecture", "llama");
    g.u32("general.alignment", 32);
    g.u32("llama.block_count", 2);
    g.u32("llama.embedding_length", 16);
    g.u32("llama.attention.head_count", 4);
    g.u32("llama.attention.head_count_kv", 2);
    g.tensor("token_embd.weight", &[4, 2], vec![0.5; 8]);
    g.tensor("output_norm.weight", &[4], vec![1.0; 4]);
    g.to_bytes()
}

/// A safetensors file of two tensors, with `__metadata__`.
fn tiny_safetensors() -> Vec<u8> {
    let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&[0x3f; 16]);
    out
}

/// The demo config with its `local.json`, and each invalid fixture's `settings.json`.
fn config_seeds(root: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let fixtures = root.join("fixtures");
    let mut demo = std::fs::read(fixtures.join("demo/settings.json"))?;
    demo.push(0);
    demo.extend(std::fs::read(fixtures.join("demo/local.json"))?);
    let mut seeds = vec![("demo".to_owned(), demo)];
    let mut invalid: Vec<PathBuf> =
        std::fs::read_dir(fixtures.join("invalid"))?.flatten().map(|e| e.path()).collect();
    invalid.sort();
    for dir in invalid {
        if let Ok(settings) = std::fs::read(dir.join("settings.json")) {
            let name =
                dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            seeds.push((format!("invalid-{name}"), settings));
        }
    }
    Ok(seeds)
}

/// A route byte (the target picks the route by it) with a body of every kind, for the
/// first 48 route picks.
fn body_seeds() -> Vec<(String, Vec<u8>)> {
    let bodies = [
        r#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#,
        r#"{"model":"embed","input":["a","b"]}"#,
        r#"{"model":"rerank","query":"q","documents":["a","b"]}"#,
        r#"{"model":"chat","prompt":"hi","max_tokens":2,"stream":true}"#,
        r#"{"model_name":"chat","ctx_size":512}"#,
        r#"{"replicas":1}"#,
        "{}",
    ];
    (0u8..48)
        .map(|pick| {
            let body = bodies[usize::from(pick) % bodies.len()];
            let mut bytes = vec![pick];
            bytes.extend_from_slice(body.as_bytes());
            (pick.to_string(), bytes)
        })
        .collect()
}

/// gRPC calls for the `grpc` target: the RPC's index (as `hangar_fuzz`'s list has them),
/// then its protobuf message; with the index's high bit, a body of raw frames.
fn grpc_seeds() -> Vec<(String, Vec<u8>)> {
    /// A length-delimited protobuf field.
    fn field(number: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2, u8::try_from(value.len()).expect("short")];
        out.extend_from_slice(value);
        out
    }
    let config = [field(1, b"config"), field(2, &field(3, br#"{"replicas":1}"#))].concat();
    let calls: [(u8, Vec<u8>); 10] = [
        (0, Vec::new()),
        (1, Vec::new()),
        (2, field(1, b"chat")),
        (3, Vec::new()),
        (4, [field(1, b"embed"), field(2, b"1")].concat()),
        (5, vec![0x10, 1]),
        (6, [field(2, b"cold"), field(3, &config)].concat()),
        (7, field(2, b"cold")),
        (8, field(1, b"chat")),
        // A frame that says 16 bytes and holds 3, and a compressed flag with no encoding.
        (0x80 | 2, vec![0, 0, 0, 0, 16, 0x0a, 1, b'x', 1, 0, 0, 0, 0]),
    ];
    calls
        .into_iter()
        .enumerate()
        .map(|(i, (pick, message))| (i.to_string(), [vec![pick], message].concat()))
        .collect()
}
