//! Tidy checks over the workspace: the layering of the design holds, and every crate says
//! what it owns.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn metadata() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
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

#[test]
fn internal_dependencies_point_down_the_layers() {
    // Which hangar crates each crate may depend on (design.md, "Layers").
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("hangar-config", &[][..]),
        ("hangar-eviction", &["hangar-config"][..]),
        ("hangar-lifecycle", &["hangar-config"][..]),
        ("hangar-backend", &["hangar-config"][..]),
        (
            "hangar-runtime",
            &[
                "hangar-config",
                "hangar-lifecycle",
                "hangar-eviction",
                "hangar-backend",
                "hangar-gpu",
            ][..],
        ),
    ]);
    for (krate, deps) in dependencies() {
        let Some(ok) = allowed.get(krate.as_str()) else { continue };
        for dep in deps.iter().filter(|d| d.starts_with("hangar-")) {
            assert!(ok.contains(&dep.as_str()), "{krate} must not depend on {dep}");
        }
    }
}

#[test]
fn only_the_server_and_binaries_know_http_and_anyhow() {
    let http = ["hyper", "http", "http-body-util", "hyper-util", "axum", "reqwest"];
    for (krate, deps) in dependencies() {
        if !krate.starts_with("hangar-") || krate == "hangar-server" {
            continue;
        }
        for dep in &deps {
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
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut seen = 0;
    for entry in std::fs::read_dir(crates).unwrap() {
        let lib = entry.unwrap().path().join("src/lib.rs");
        let text =
            std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        assert!(text.starts_with("//! "), "{} must start with a //! crate doc", lib.display());
        seen += 1;
    }
    assert!(seen >= 5, "found only {seen} crates");
}
