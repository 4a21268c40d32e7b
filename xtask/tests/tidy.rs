//! Tidy checks over the workspace: the layering of the design holds, every crate says what
//! it owns, every Rust file stays small enough to read in one sitting, and each package's
//! integration tests link as one binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn metadata() -> Value {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("metadata is JSON")
}

/// Normal (non-dev) dependencies of each workspace package.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let meta = metadata();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

/// Which workspace crates a crate may depend on.
enum May {
    /// Only these.
    Use(&'static [&'static str]),
    /// Any of them: the composition root and the project automation.
    UseAnything,
}

/// Every crate of the design's layering (design.md, "Layers") and what it may depend on.
/// Crates that do not exist yet are listed too, so they are checked from their first commit.
const LAYERS: [(&str, May); 19] = [
    ("hangar-config", May::Use(&[])),
    ("hangar-eviction", May::Use(&["hangar-config"])),
    ("hangar-lifecycle", May::Use(&["hangar-config"])),
    // The engine contract only: traits, their request and answer types, the error taxonomy.
    ("hangar-backend", May::Use(&["hangar-config"])),
    // Prompt formats render the contract's chat messages; no engine uses another's.
    ("hangar-prompt", May::Use(&["hangar-backend", "hangar-config"])),
    // The stub engine is a test double: no crate uses it but the composition roots (and
    // tests, as a dev-dependency).
    ("hangar-stub", May::Use(&["hangar-backend", "hangar-config"])),
    // A future adapter for HTTP tasks: a leaf.
    ("hangar-coalesce", May::Use(&[])),
    // GPU telemetry knows nothing of models; at most of the config vocabulary.
    ("hangar-gpu", May::Use(&["hangar-config"])),
    // Weight-file digests know nothing of models or engines: a leaf.
    ("hangar-weights", May::Use(&[])),
    // Saved prompt caches know nothing of engines or models but their names: a leaf.
    ("hangar-prompt-cache", May::Use(&[])),
    // Adapters: the backend contract and the config, nothing above them.
    (
        "hangar-backend-llamacpp",
        May::Use(&["hangar-backend", "hangar-config", "hangar-prompt", "hangar-prompt-cache"]),
    ),
    // Every child process runs under the one supervisor, which knows nothing of HTTP.
    ("hangar-supervisor", May::Use(&["hangar-backend", "hangar-config"])),
    (
        "hangar-backend-process",
        May::Use(&[
            "hangar-backend",
            "hangar-config",
            "hangar-supervisor",
            "hangar-coalesce",
            "hangar-prompt-cache",
        ]),
    ),
    // The bridge's workers run under the supervisor too; the bridge pulls in no HTTP stack.
    (
        "hangar-backend-bridge",
        May::Use(&["hangar-backend", "hangar-config", "hangar-supervisor", "hangar-prompt"]),
    ),
    (
        "hangar-runtime",
        May::Use(&[
            "hangar-config",
            "hangar-lifecycle",
            "hangar-eviction",
            "hangar-backend",
            "hangar-gpu",
            "hangar-weights",
            "hangar-prompt-cache",
            "hangar-coalesce",
        ]),
    ),
    // One wire boundary: the server reaches engines, the lifecycle and GPUs only through
    // the runtime (which re-exports what callers need).
    ("hangar-server", May::Use(&["hangar-runtime", "hangar-config"])),
    ("hangard", May::UseAnything),
    // The fuzz checks drive the readers and the whole service, as the binary does; nothing
    // depends on them but the fuzzer's binaries and their own replay tests.
    ("hangar-fuzz", May::UseAnything),
    ("xtask", May::UseAnything),
];

#[test]
fn internal_dependencies_point_down_the_layers() {
    let deps = dependencies();
    let workspace: BTreeSet<&str> = deps.keys().map(String::as_str).collect();
    let table: BTreeMap<&str, &May> = LAYERS.iter().map(|(name, may)| (*name, may)).collect();
    let mut problems = Vec::new();
    for (krate, deps) in &deps {
        let Some(may) = table.get(krate.as_str()) else {
            problems.push(format!(
                "{krate} is a workspace crate missing from LAYERS in xtask/tests/tidy.rs: add it \
                 with the workspace crates it may depend on (design.md, \"Layers\")"
            ));
            continue;
        };
        let May::Use(ok) = may else { continue };
        for dep in deps.iter().filter(|d| workspace.contains(d.as_str())) {
            if !ok.contains(&dep.as_str()) {
                problems.push(format!("{krate} must not depend on {dep} (may use: {ok:?})"));
            }
        }
    }
    assert!(problems.is_empty(), "layering broken:\n  {}", problems.join("\n  "));
}

#[test]
fn only_the_server_and_binaries_know_http_and_anyhow() {
    let http = ["hyper", "http", "http-body-util", "hyper-util", "axum", "reqwest"];
    for (krate, deps) in dependencies() {
        // The fuzz checks send requests to the service in process: a test harness, not a core
        // crate.
        if !krate.starts_with("hangar-") || krate == "hangar-server" || krate == "hangar-fuzz" {
            continue;
        }
        for dep in &deps {
            // The subprocess engines talk to their children over HTTP by design: hyper's
            // client (with rustls for https remotes), never Hangar's server or routes.
            let client = ["hyper", "http", "http-body-util", "hyper-util", "hyper-rustls"];
            if krate == "hangar-backend-process" && client.contains(&dep.as_str()) {
                continue;
            }
            assert!(
                !http.contains(&dep.as_str()),
                "{krate} is a core crate and must not use {dep}"
            );
            assert!(dep != "anyhow", "{krate} is a library: one thiserror enum, no anyhow");
        }
    }
}

#[test]
fn every_library_crate_starts_with_a_doc_saying_what_it_owns() {
    let mut seen = 0;
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let lib = entry.unwrap().path().join("src/lib.rs");
        let text =
            std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        assert!(text.starts_with("//! "), "{} must start with a //! crate doc", lib.display());
        seen += 1;
    }
    assert!(seen >= 5, "found only {seen} crates");
}

/// The most lines a Rust source file may have.
const MAX_LINES: usize = 600;

#[test]
fn every_rust_file_is_readable_in_one_sitting() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "bins", "xtask", "fuzz"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    files.sort();
    let mut long = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let lines = text.lines().count();
        if lines > MAX_LINES {
            let shown = file.strip_prefix(&root).unwrap_or(file);
            long.push(format!("{}: {lines} lines", shown.display()));
        }
    }
    assert!(
        long.is_empty(),
        "Rust files over {MAX_LINES} lines (split them by concern into modules):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn every_package_links_its_integration_tests_as_one_binary() {
    let meta = metadata();
    let mut problems = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        let tests: Vec<&str> = package["targets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "test"))
            .map(|t| t["src_path"].as_str().unwrap())
            .collect();
        if tests.len() > 1 {
            problems.push(format!("{}: {}", package["name"].as_str().unwrap(), tests.join(", ")));
        }
    }
    assert!(
        problems.is_empty(),
        "packages with more than one integration-test binary (each links the crate and its \
         dependencies again): make each file a module of tests/it/main.rs, helpers in \
         tests/it/support, instead of a file directly under tests/:\n  {}",
        problems.join("\n  ")
    );
}

/// Every `.rs` file under `dir`, recursively, build outputs (`target`) left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "target" || n == "node_modules") {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_server_reaches_engines_and_the_lifecycle_only_through_the_runtime() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/hangar-server/src"), &mut files);
    assert!(!files.is_empty(), "no server sources found");
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let reaches = |c: &str| line.contains(c);
            if ["hangar_lifecycle::", "hangar_backend::", "hangar_gpu::"].into_iter().any(reaches) {
                let shown = file.strip_prefix(root()).unwrap_or(file);
                problems.push(format!("{}:{}: {}", shown.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the server uses hangar-runtime (hangar_runtime::engine, hangar_runtime::ModelState) and \
         hangar-config only:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn lemonade_arguments_are_mapped_onto_model_fields_in_one_place() {
    // hangar-config's `LemonadeArgs::map` is the mapping; `hangard serve`'s flags and
    // `POST /api/v1/load` both call it. The fields it sets, named outside it (tests aside),
    // would be a second mapping.
    let fields =
        ["context_size_field(", "\"llama_server_extra_args\"", "\"llama_server_binary_path\""];
    let mut files = Vec::new();
    rust_files(&root().join("crates/hangar-server/src"), &mut files);
    rust_files(&root().join("bins/hangard/src"), &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for field in fields.iter().filter(|f| code.contains(**f)) {
            let shown = file.strip_prefix(root()).unwrap_or(file);
            problems.push(format!("{}: {field}", shown.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "map Lemonade's arguments with hangar_config::LemonadeArgs::map:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_engine_contract_crate_holds_the_contract_only() {
    // Prompt formats (a template engine), the stub engine, override validation and the HTTP
    // wake-up helper each live in a crate named for them; `hangar-backend` is what every
    // engine implements and nothing else.
    let deps = dependencies();
    let contract = &deps["hangar-backend"];
    for other in ["minijinja", "minijinja-contrib", "hyper", "hyper-util", "http"] {
        assert!(!contract.contains(other), "hangar-backend must not use {other}");
    }
    let mut files = Vec::new();
    rust_files(&root().join("crates/hangar-backend/src"), &mut files);
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for marker in
            ["impl Backend for", "fn validate_load_override", "fn render(", "impl Future for"]
        {
            assert!(
                !text.contains(marker),
                "{}: `{marker}` belongs in the crate named for it, not the engine contract",
                file.display()
            );
        }
    }
    // Only the composition roots use the stub engine outside tests.
    for (krate, deps) in &deps {
        if deps.contains("hangar-stub") {
            assert!(
                ["hangard", "hangar-fuzz", "xtask"].contains(&krate.as_str()),
                "{krate} must not depend on the stub engine (a dev-dependency is fine)"
            );
        }
    }
}

/// The variant names of `pub enum {name}` in `text`.
fn variants(text: &str, name: &str) -> Vec<String> {
    let start = text.find(&format!("pub enum {name} {{")).unwrap_or_else(|| panic!("no {name}"));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
        .filter_map(|l| l.strip_suffix(','))
        .map(str::to_owned)
        .collect()
}

#[test]
fn error_codes_are_one_enum_in_the_runtime_plus_the_http_layers_own() {
    // The runtime's `ErrorCode` is the one vocabulary; the server joins it with `HttpCode`,
    // the codes only HTTP produces. Any other `…Code` enum is a second vocabulary that needs
    // a mapping (the string parse this rule replaced).
    let allowed = [
        ("crates/hangar-runtime/src/error.rs", "ErrorCode"),
        ("crates/hangar-server/src/codes.rs", "ErrorCode"),
        ("crates/hangar-server/src/codes.rs", "HttpCode"),
    ];
    let mut files = Vec::new();
    for dir in ["crates", "bins", "xtask/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(root()).unwrap_or(file).to_string_lossy().into_owned();
        for line in text.lines().map(str::trim_start) {
            let Some(rest) = line.strip_prefix("pub enum ").or(line.strip_prefix("enum ")) else {
                continue;
            };
            let name: String =
                rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name.ends_with("Code") && !allowed.contains(&(shown.as_str(), name.as_str())) {
                problems.push(format!("{shown}: enum {name}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "a second error-code enum: map the error's variants onto hangar_runtime::ErrorCode \
         instead (or, for a code only HTTP produces, add it to the server's HttpCode):\n  {}",
        problems.join("\n  ")
    );
    let runtime = std::fs::read_to_string(root().join(allowed[0].0)).unwrap();
    let server = std::fs::read_to_string(root().join(allowed[2].0)).unwrap();
    let runtime_codes = variants(&runtime, "ErrorCode");
    assert!(runtime_codes.len() > 20, "parsed {runtime_codes:?}");
    for code in variants(&server, "HttpCode") {
        assert!(!runtime_codes.contains(&code), "HttpCode::{code} repeats the runtime's code");
    }
}

#[test]
fn only_the_server_and_the_config_describe_wire_schemas() {
    // The server owns every wire type and its schema; the config owns the config file's.
    // Runtime, lifecycle, engine and weights types carry none: the server mirrors them.
    for (krate, deps) in dependencies() {
        if deps.contains("schemars") {
            assert!(
                ["hangar-server", "hangar-config"].contains(&krate.as_str()),
                "{krate} must not derive JSON schemas: give the type a wire twin in \
                 hangar-server's `wire` module, converted with From"
            );
        }
    }
}
