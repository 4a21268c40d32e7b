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

/// The absolute path of a trained model `cargo xtask fixtures` fetched (`file` in
/// `HANGAR_TRAINED_MODELS`, else in `target/models`), or `None` after a loud message when it
/// is not there and `HANGAR_TRAINED_MODELS` is unset: a plain `cargo test` skips the tests
/// that need one. Under `cargo xtask test` (which sets the variable) a missing file fails.
pub(crate) fn trained(file: &str) -> Option<String> {
    let set = std::env::var_os("HANGAR_TRAINED_MODELS");
    let dir = set.clone().map_or_else(|| workspace().join("target/models"), PathBuf::from);
    match std::fs::canonicalize(dir.join(file)) {
        Ok(path) => Some(path.to_str().unwrap().to_owned()),
        Err(e) if set.is_some() => {
            panic!(
                "HANGAR_TRAINED_MODELS={}: no {file} ({e}); run `cargo xtask fixtures`",
                dir.display()
            )
        }
        Err(_) => {
            eprintln!(
                "\n*** SKIPPED: no trained model {file} in {}: run `cargo xtask fixtures` (or \
                 `cargo xtask test`, which fetches it) ***\n",
                dir.display()
            );
            None
        }
    }
}

/// A `llama-server` a test starts itself, with no Hangar in between; killed on drop.
pub(crate) struct Standalone {
    child: std::process::Child,
    port: u16,
}

impl Standalone {
    /// Starts `llama-server -m model` with `args` on a free loopback port and waits (60 s at
    /// most) until `/health` answers 200.
    pub(crate) async fn start(model: &str, args: &[&str]) -> Self {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(llama_server_binary())
            .args(["-m", model, "--host", "127.0.0.1", "--port", &port.to_string(), "--no-webui"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts");
        let mut standalone = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = reqwest::get(standalone.url("/health")).await.is_ok_and(|r| r.status() == 200);
            if ok {
                return standalone;
            }
            if let Some(status) = standalone.child.try_wait().unwrap() {
                panic!("llama-server exited ({status}) before it was healthy");
            }
            assert!(Instant::now() < deadline, "llama-server not healthy after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
