//! Every committed fuzz input — the corpus `cargo xtask fuzz` grew and minimized, and every
//! crash it found (kept as a regression input) — replayed through its target's check, on
//! the stable toolchain with no fuzzer. A finding fixed once stays fixed.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_committed_input_passes_its_targets_check() {
    for target in hangar_fuzz::TARGETS {
        let corpus = inputs(&fuzz_dir().join("corpus").join(target.name));
        assert!(
            corpus.len() >= 2,
            "fuzz/corpus/{} holds {} inputs: run `cargo xtask fuzz --target {}`",
            target.name,
            corpus.len(),
            target.name
        );
        let found = inputs(&fuzz_dir().join("regressions").join(target.name));
        for file in corpus.iter().chain(&found) {
            let data = std::fs::read(file).unwrap();
            let outcome = std::panic::catch_unwind(|| (target.check)(&data));
            assert!(outcome.is_ok(), "{}: {} fails its check", target.name, file.display());
        }
    }
}

#[test]
fn an_unknown_target_is_refused() {
    let outcome = std::panic::catch_unwind(|| hangar_fuzz::run("no-such-target", b""));
    assert!(outcome.is_err());
}

#[test]
fn every_target_has_its_fuzzer_binary() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for target in hangar_fuzz::TARGETS {
        assert!(manifest.contains(&format!("name = \"{}\"", target.name)), "{}", target.name);
        let source = fuzz_dir().join("fuzz_targets").join(format!("{}.rs", target.name));
        let source = std::fs::read_to_string(&source).unwrap();
        assert!(source.contains(&format!("hangar_fuzz::run(\"{}\"", target.name)), "{source}");
    }
}
