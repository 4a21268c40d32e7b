//! The state file: measured VRAM figures kept across restarts in `<state_dir>/vram.json`,
//! never in the config.
//!
//! Each model's figures are stored with its definition; a model whose definition changed
//! since (another file, another context) starts without them. Writes replace the file
//! atomically (a temporary file renamed over it); a file that cannot be read or written is
//! logged and otherwise ignored: figures are an optimisation, never a reason to fail.

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
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(contents).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }
}
