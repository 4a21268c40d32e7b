//! The fake NVML library the tests build: `tests/fake/libnvidia-ml.c` in this crate, a
//! `libnvidia-ml.so.1` that answers the calls [`NvmlProbe`](crate::NvmlProbe) makes from a
//! script file, `nvml-script` next to it, read again on every call (lines `gpu INDEX USED
//! TOTAL NAME…`, `proc GPU PID MIB`, `fail init`). Point
//! [`NVML_LIBRARY_ENV`](crate::NVML_LIBRARY_ENV) at it.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The fake's C source, in this crate's source tree.
pub const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake/libnvidia-ml.c");

/// Compiles the fake into `dir` with `$CC` (default `cc`) and returns the library's path;
/// its script is `nvml-script` beside it.
///
/// # Errors
/// When the compiler cannot be run or fails.
pub fn build(dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let out = dir.join("libnvidia-ml.so.1");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-pthread", "-O1", "-o"])
        .arg(&out)
        .arg(SOURCE)
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!("{compiler} failed on {SOURCE}: {status}")));
    }
    Ok(out)
}
