//! Where the tests find their engines: the committed GGUF fixtures, the `llama-server`
//! binary `cargo xtask llama-server` builds, and the fake `vllm serve`.

use std::path::{Path, PathBuf};

/// The workspace root.
pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The absolute path of a committed GGUF fixture.
pub(crate) fn fixture(name: &str) -> String {
    let path = workspace().join("fixtures/models").join(name);
    let path = std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path.to_str().unwrap().to_owned()
}

/// The fake `vllm serve` of `hangar-backend-process`'s tests (Python, stdlib only).
pub(crate) fn fake_vllm() -> String {
    let path = workspace().join("crates/hangar-backend-process/tests/fake-vllm/vllm");
    std::fs::canonicalize(path).unwrap().to_str().unwrap().to_owned()
}

/// The `llama-server` binary: `HANGAR_LLAMA_SERVER`, else the one `cargo xtask llama-server`
/// builds. Missing, the test fails: these tests are not skipped silently.
pub(crate) fn llama_server_binary() -> String {
    const HOW: &str = "run `cargo xtask llama-server` to build it (or `cargo xtask test`, \
                       which builds it and sets HANGAR_LLAMA_SERVER)";
    if let Some(path) = std::env::var_os("HANGAR_LLAMA_SERVER") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "HANGAR_LLAMA_SERVER={} is not a file; {HOW}", path.display());
        return path.to_str().unwrap().to_owned();
    }
    let path = workspace().join("target/llama-server/llama-server");
    let Ok(path) = std::fs::canonicalize(&path) else {
        panic!(
            "no llama-server: HANGAR_LLAMA_SERVER is unset and {} does not exist; {HOW}",
            path.display()
        );
    };
    path.to_str().unwrap().to_owned()
}
