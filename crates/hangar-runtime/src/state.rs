//! The state file: measured VRAM figures kept across restarts in `<state_dir>/vram.json`,
//! never in the config.
//!
//! Each model's figures are stored with its definition; a model whose definition changed
//! since (another file, another context) starts without them. Writes replace the file
//! atomically and durably: a new temporary file of a unique name in the same directory
//! (created exclusively, so a symlink or file planted under any name is never followed or
//! overwritten), fsynced, renamed over the file, and the directory fsynced. A file that
//! cannot be read or written is logged and otherwise ignored: figures are an optimisation,
//! never a reason to fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::entry::ModelEntry;
use crate::vram::Figure;

/// The file's name in `state_dir`.
pub const VRAM_STATE_FILE: &str = "vram.json";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Contents {
    version: u32,
    models: BTreeMap<String, Saved>,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    definition: Map<String, Value>,
    figures: Vec<Figure>,
}

/// Where figures persist.
pub(crate) struct StateFile {
    path: PathBuf,
    /// One writer at a time.
    writing: Mutex<()>,
}

impl StateFile {
    pub(crate) fn new(dir: &Path) -> Self {
        Self { path: dir.join(VRAM_STATE_FILE), writing: Mutex::new(()) }
    }

    /// Gives each model the figures saved for its current definition.
    pub(crate) fn restore(&self, entries: &[Arc<ModelEntry>]) {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the VRAM state file; starting without measured figures");
                return;
            }
        };
        let contents = match serde_json::from_str::<Contents>(&text) {
            Ok(c) if c.version == VERSION => c,
            Ok(c) => {
                tracing::warn!(path = %self.path.display(), version = c.version, "VRAM state file of another version ignored");
                return;
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "VRAM state file is not valid; ignored");
                return;
            }
        };
        let mut models = contents.models;
        for entry in entries {
            let Some(saved) = models.remove(entry.config.name.as_str()) else { continue };
            if saved.definition != entry.config.definition() {
                tracing::info!(model = %entry.config.name, "definition changed since its VRAM was measured; figures dropped");
                continue;
            }
            entry.lock().vram.figures = saved.figures;
        }
    }

    /// Writes every model's figures (blocking: call it off the async threads).
    pub(crate) fn save(&self, entries: &[Arc<ModelEntry>]) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let models = entries
            .iter()
            .filter_map(|entry| {
                let figures = entry.lock().vram.figures.clone();
                let definition = entry.config.definition();
                (!figures.is_empty())
                    .then(|| (entry.config.name.to_string(), Saved { definition, figures }))
            })
            .collect();
        let contents = Contents { version: VERSION, models };
        if let Err(e) = self.write(&contents) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write the VRAM state file");
        }
    }

    fn write(&self, contents: &Contents) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(contents).map_err(std::io::Error::other)?;
        replace(&self.path, &text)
    }
}

/// Replaces the file at `path` with `bytes`, atomically and durably. The temporary file is
/// `tempfile`'s: a random name, opened with `O_CREAT | O_EXCL` (which never follows a
/// symlink), mode 0600, removed if anything fails before the rename.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{VRAM_STATE_FILE}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // The rename is durable once the directory's entry is.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn symlinks_planted_at_the_temporary_or_the_target_name_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().join("precious");
        std::fs::write(&outside, "precious").unwrap();
        // Where the state file was once written first (a fixed name), and the file itself.
        let old_tmp = dir.path().join("vram.json.tmp");
        std::os::unix::fs::symlink(&outside, &old_tmp).unwrap();
        let state = StateFile::new(dir.path());
        let contents = || Contents { version: VERSION, models: BTreeMap::new() };
        state.write(&contents()).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        let written = std::fs::read_to_string(dir.path().join(VRAM_STATE_FILE)).unwrap();
        assert!(written.contains("\"version\": 1"), "{written}");
        // Nothing left behind but the file and the planted link, which still points away.
        assert_eq!(names(dir.path()), [VRAM_STATE_FILE, "vram.json.tmp"]);
        assert_eq!(std::fs::read_link(&old_tmp).unwrap(), outside);

        // A link in place of the file itself is replaced, not written through.
        let target = dir.path().join(VRAM_STATE_FILE);
        std::fs::remove_file(&target).unwrap();
        std::os::unix::fs::symlink(&outside, &target).unwrap();
        state.write(&contents()).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        assert!(!std::fs::symlink_metadata(&target).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_missing_directory_is_created_and_an_unwritable_one_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a").join("b");
        let state = StateFile::new(&nested);
        state.write(&Contents { version: VERSION, models: BTreeMap::new() }).unwrap();
        assert_eq!(names(&nested), [VRAM_STATE_FILE]);
        // A state "directory" that is a file: the write fails, nothing is created.
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let blocked = StateFile::new(&file);
        assert!(blocked.write(&Contents { version: VERSION, models: BTreeMap::new() }).is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    }
}
