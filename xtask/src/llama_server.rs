//! `cargo xtask llama-server`: llama.cpp's own `llama-server`, built once and shared by the
//! tests (`HANGAR_LLAMA_SERVER`), the demo config, `cargo xtask e2e` and
//! `cargo xtask bench llamacpp`.
//!
//! The binary is built from the llama.cpp tree vendored in the PyPI source distribution of
//! `llama-cpp-python` ([`LCP_VERSION`], checked against [`LCP_SHA256`]), with the CPU flags
//! `llama-cpp-sys-2` gives Hangar's own llama.cpp (no `GGML_NATIVE`; AVX2/FMA/F16C) and
//! statically linked like it ([`CMAKE_OPTIONS`]).
//!
//! - The build runs in `target/llama-server/llama-cpp-python-<version>/` (sdist, unpacked
//!   source, CMake build tree).
//! - The binary is copied to the stable path `target/llama-server/llama-server`, next to a
//!   stamp (`llama-server.stamp`) naming the version and options it was built with, so a
//!   second run builds nothing and a changed version or option replaces it. The build
//!   directory (about 400 MB) is then removed: CI machines can be short of disk.
//!
//! Every child's stdout goes to our stderr: `cargo xtask llama-server` prints only the
//! binary's path on stdout.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::run as run_checked;

/// The `llama-cpp-python` release whose vendored llama.cpp builds `llama-server`: the
/// newest on PyPI, and the closest to what `llama-cpp-sys-2` 0.1.161 vendors (which is newer).
pub(crate) const LCP_VERSION: &str = "0.3.36";
/// SHA-256 of `llama_cpp_python-0.3.36.tar.gz`, as PyPI lists it.
const LCP_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// CMake options of the `llama-server` build. `GGML_NATIVE=OFF` gives the same CPU
/// instruction sets as Hangar's llama.cpp; static libraries as in Hangar.
const CMAKE_OPTIONS: [&str; 8] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
];

/// The stable `llama-server` binary (`<target>/llama-server/llama-server`, absolute),
/// built when missing or built from another version or other options. cmake must be
/// present (see [`crate::deps::ensure`]) when it has to be built.
pub(crate) fn ensure(root: &Path) -> Result<PathBuf> {
    let dir = crate::target_dir(root)?.join("llama-server");
    let stable = dir.join("llama-server");
    let stable_stamp = dir.join("llama-server.stamp");
    let expected = format!("llama-cpp-python {LCP_VERSION}; {}", CMAKE_OPTIONS.join(" "));
    if stable.exists() && stamp_is(&stable_stamp, &expected) {
        eprintln!("llama-server: cached {} (llama-cpp-python {LCP_VERSION})", stable.display());
        return Ok(stable);
    }
    let work = dir.join(format!("llama-cpp-python-{LCP_VERSION}"));
    let built = build(&work)?;
    // Copy next to it, then rename: a reader never sees a half-written binary.
    let part = dir.join("llama-server.part");
    std::fs::copy(&built, &part)
        .with_context(|| format!("cannot copy {} to {}", built.display(), part.display()))?;
    std::fs::rename(&part, &stable)
        .with_context(|| format!("cannot move {} to {}", part.display(), stable.display()))?;
    std::fs::write(&stable_stamp, format!("{expected}\n"))
        .with_context(|| format!("cannot write {}", stable_stamp.display()))?;
    eprintln!("llama-server: installed {}", stable.display());
    std::fs::remove_dir_all(&work).with_context(|| format!("cannot remove {}", work.display()))?;
    Ok(stable)
}

/// Downloads, unpacks and builds `llama-server` in `dir` (`…/llama-cpp-python-<version>`);
/// the built binary. A build that was interrupted left `dir` behind, and CMake resumes it.
fn build(dir: &Path) -> Result<PathBuf> {
    let prefix = format!("llama_cpp_python-{LCP_VERSION}");
    let sdist = sdist(dir)?;
    let source = dir.join(&prefix).join("vendor").join("llama.cpp");
    if !source.join("CMakeLists.txt").exists() {
        let mut unpack = Command::new("tar");
        unpack.arg("-xzf").arg(&sdist).arg("-C").arg(dir);
        // The submodule's git directory too, so the build knows its commit.
        unpack.arg(format!("{prefix}/vendor/llama.cpp"));
        unpack.arg(format!("{prefix}/.git/modules/vendor/llama.cpp"));
        run_to_stderr(unpack)?;
    }
    let build = dir.join("build");
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("llama-server: building with {jobs} job(s) (about 12 minutes on 2 cores)");
    let mut configure = Command::new("cmake");
    configure.arg("-S").arg(&source).arg("-B").arg(&build).args(CMAKE_OPTIONS);
    run_to_stderr(configure)?;
    let mut compile = Command::new("cmake");
    compile.arg("--build").arg(&build).args(["--target", "llama-server", "-j", &jobs.to_string()]);
    run_to_stderr(compile)?;
    Ok(build.join("bin").join("llama-server"))
}

/// The `llama-cpp-python` sdist in `dir` (`llama_cpp_python-<version>.tar.gz`), downloaded
/// from PyPI and checked against [`LCP_SHA256`] when missing.
pub(crate) fn sdist(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let sdist = dir.join(format!("llama_cpp_python-{LCP_VERSION}.tar.gz"));
    if !sdist.exists() {
        eprintln!("llama-server: downloading llama-cpp-python {LCP_VERSION} (sdist) from PyPI");
        crate::pypi::download("llama-cpp-python", LCP_VERSION, "sdist", LCP_SHA256, &sdist)?;
    }
    Ok(sdist)
}

/// Whether the stamp file at `path` holds `expected`.
fn stamp_is(path: &Path, expected: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.trim() == expected)
}

/// [`crate::run`] with the child's stdout sent to our stderr.
fn run_to_stderr(mut cmd: Command) -> Result<()> {
    cmd.stdout(std::io::stderr());
    run_checked(cmd)
}
