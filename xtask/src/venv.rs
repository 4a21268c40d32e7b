//! Python virtualenvs under `target/`: `e2e-venv` (the e2e clients) and `bridge-venv` (the
//! Python bridge's worker: `ctranslate2`, `numpy`, `tokenizers`, pinned in
//! `crates/hangar-backend-bridge/worker/requirements.txt`). Created once, reinstalled only
//! when the pinned requirements change; `python3-venv` is installed with apt when
//! `python3 -m venv` cannot work and we are root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::run as run_checked;

/// The bridge worker's pinned packages.
pub(crate) const BRIDGE_REQUIREMENTS: &str = "crates/hangar-backend-bridge/worker/requirements.txt";

/// The bridge virtualenv's interpreter, `target/bridge-venv/bin/python`, with the pinned
/// packages installed (once: the installed requirements are recorded next to it).
pub(crate) fn ensure_bridge(root: &Path) -> Result<PathBuf> {
    let venv = crate::target_dir(root)?.join("bridge-venv");
    let python = ensure_venv(&venv)?;
    let requirements = root.join(BRIDGE_REQUIREMENTS);
    let wanted = std::fs::read_to_string(&requirements)
        .with_context(|| format!("cannot read {}", requirements.display()))?;
    let stamp = venv.join(".hangar-requirements");
    if std::fs::read_to_string(&stamp).is_ok_and(|had| had == wanted) {
        return Ok(python);
    }
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet", "-r"]);
    pip.arg(&requirements);
    run_checked(pip)?;
    std::fs::write(&stamp, wanted).with_context(|| format!("cannot write {}", stamp.display()))?;
    Ok(python)
}

/// The virtualenv's python, creating the virtualenv when it is missing or has no pip.
pub(crate) fn ensure_venv(venv: &Path) -> Result<PathBuf> {
    let python = venv.join("bin").join("python");
    if quiet(Command::new(&python).args(["-m", "pip", "--version"])) {
        return Ok(python);
    }
    if venv.exists() {
        std::fs::remove_dir_all(venv)
            .with_context(|| format!("cannot remove {}", venv.display()))?;
    }
    if !create_venv(venv) {
        let _ = std::fs::remove_dir_all(venv);
        if !is_root() {
            bail!(
                "`python3 -m venv` failed: install the Debian/Ubuntu package `python3-venv` \
                 (sudo apt-get install -y python3-venv) and run the command again"
            );
        }
        eprintln!("`python3 -m venv` failed; installing python3-venv with apt-get");
        let install = || {
            let mut cmd = Command::new("apt-get");
            cmd.args(["install", "-y", "--no-install-recommends", "python3-venv"]);
            cmd.env("DEBIAN_FRONTEND", "noninteractive");
            run_checked(cmd)
        };
        if install().is_err() {
            run_checked({
                let mut update = Command::new("apt-get");
                update.arg("update");
                update
            })?;
            install().context("apt-get install python3-venv failed")?;
        }
        let _ = std::fs::remove_dir_all(venv);
        if !create_venv(venv) {
            bail!("`python3 -m venv {}` still fails after installing python3-venv", venv.display());
        }
    }
    Ok(python)
}

fn create_venv(venv: &Path) -> bool {
    eprintln!("$ python3 -m venv {}", venv.display());
    Command::new("python3").args(["-m", "venv"]).arg(venv).status().is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Runs a command with its output discarded; whether it succeeded.
pub(crate) fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}
