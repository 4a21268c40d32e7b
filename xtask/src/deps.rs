//! `cargo xtask deps`: the system packages the llama.cpp build needs.
//!
//! `llama-cpp-sys-2` builds llama.cpp with CMake and generates its bindings with bindgen,
//! which loads libclang. On a machine without them this installs `cmake`, `clang` and
//! `libclang-dev` through apt when running as root, and otherwise says what to install.
//! `cargo xtask e2e` installs Debian's `chromium` the same way ([`ensure_chromium`]) for the
//! workbench's browser test, and `iproute2` for the multi-host test ([`ensure_iproute2`]).

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Result, bail};

/// Debian/Ubuntu packages that provide what is missing.
const PACKAGES: [&str; 3] = ["cmake", "clang", "libclang-dev"];

/// Checks for cmake and libclang; installs them when missing and allowed to.
pub(crate) fn ensure() -> Result<()> {
    let missing = missing();
    if missing.is_empty() {
        eprintln!("deps: cmake and libclang present");
        return Ok(());
    }
    eprintln!("deps: missing {}", missing.join(", "));
    if !is_root() {
        bail!(
            "the llama.cpp build needs {}; install them (e.g. `sudo apt-get install -y {}`) \
             and run again",
            missing.join(" and "),
            PACKAGES.join(" ")
        );
    }
    if !succeeds(Command::new("apt-get").arg("--version")) {
        bail!(
            "the llama.cpp build needs {}, and apt-get is not available here to install {}",
            missing.join(" and "),
            PACKAGES.join(" ")
        );
    }
    crate::run(apt(&["update"]))?;
    let mut install = apt(&["install", "-y", "--no-install-recommends"]);
    install.args(PACKAGES);
    crate::run(install)?;
    let still = self::missing();
    if !still.is_empty() {
        bail!("still missing after apt-get install: {}", still.join(", "));
    }
    Ok(())
}

/// Where the workbench test finds Chromium: `HANGAR_CHROMIUM`, else Debian's.
pub(crate) fn chromium_path() -> std::path::PathBuf {
    std::env::var_os("HANGAR_CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), Into::into)
}

/// Checks for the Chromium the workbench's browser test drives; installs Debian's
/// `chromium` with apt when missing and running as root (Playwright downloads no browser).
pub(crate) fn ensure_chromium() -> Result<()> {
    let path = chromium_path();
    if path.exists() {
        eprintln!("deps: chromium at {}", path.display());
        return Ok(());
    }
    if !is_root() || !succeeds(Command::new("apt-get").arg("--version")) {
        bail!(
            "the workbench's browser test needs Chromium at {} (set HANGAR_CHROMIUM to another); \
             install it (e.g. `sudo apt-get install -y chromium`) and run again",
            path.display()
        );
    }
    crate::run(apt(&["update"]))?;
    crate::run(apt(&["install", "-y", "--no-install-recommends", "chromium"]))?;
    if !path.exists() {
        bail!("apt-get installed chromium, but {} is still missing", path.display());
    }
    Ok(())
}

/// Installs Debian's `iproute2` (the `ip` command) when missing and running as root; the
/// multi-host test makes network namespaces with it, and skips, loudly, where it cannot.
pub(crate) fn ensure_iproute2() -> Result<()> {
    if succeeds(Command::new("ip").arg("-V")) || !is_root() {
        return Ok(());
    }
    if succeeds(Command::new("apt-get").arg("--version")) {
        crate::run(apt(&["update"]))?;
        crate::run(apt(&["install", "-y", "--no-install-recommends", "iproute2"]))?;
    }
    Ok(())
}

/// Checks for `kubectl` with its built-in kustomize (v5: kubectl 1.27 or newer), which
/// renders `deploy/`. Debian's `kubernetes-client` is 1.20 (kustomize v2) and cannot.
pub(crate) fn ensure_kubectl() -> Result<()> {
    let out = Command::new("kubectl").args(["version", "--client"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let kustomize = text.lines().find_map(|l| l.strip_prefix("Kustomize Version: v"));
    match kustomize.and_then(|v| v.split('.').next()?.parse::<u32>().ok()) {
        Some(major) if major >= 5 => Ok(()),
        _ => bail!(
            "rendering deploy/ needs kubectl 1.27 or newer (kustomize v5); found: {}. Install \
             kubectl (the Google Cloud CLI's `kubectl` package, or kubernetes.io's release)",
            if text.is_empty() { "none" } else { text.trim() }
        ),
    }
}

fn apt(args: &[&str]) -> Command {
    let mut cmd = Command::new("apt-get");
    // Its output is progress: stdout stays free (`cargo xtask llama-server` prints a path).
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive").stdout(std::io::stderr());
    cmd
}

/// What of cmake and libclang is not there.
fn missing() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !succeeds(Command::new("cmake").arg("--version")) {
        missing.push("cmake");
    }
    if !has_libclang() {
        missing.push("libclang");
    }
    missing
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// libclang as bindgen finds it: `LIBCLANG_PATH`, the loader cache, or an LLVM install.
fn has_libclang() -> bool {
    let is_libclang = |name: &str| name.starts_with("libclang.so") || name.starts_with("libclang-");
    let dir_has = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                is_libclang(&name) && name.contains(".so") && !name.starts_with("libclang-cpp")
            })
        })
    };
    if std::env::var_os("LIBCLANG_PATH").is_some_and(|dir| dir_has(Path::new(&dir))) {
        return true;
    }
    let ldconfig = Command::new("ldconfig").arg("-p").output();
    if let Ok(out) = ldconfig {
        let text = String::from_utf8_lossy(&out.stdout);
        if text.lines().any(|l| {
            l.trim_start().starts_with("libclang.so") || l.trim_start().starts_with("libclang-1")
        }) {
            return true;
        }
    }
    ["/usr/lib", "/usr/lib64", "/usr/local/lib"].iter().any(|root| {
        std::fs::read_dir(root).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                (name.starts_with("llvm") && dir_has(&e.path().join("lib")))
                    || (name == "x86_64-linux-gnu" || name == "aarch64-linux-gnu")
                        && dir_has(&e.path())
            })
        })
    })
}
