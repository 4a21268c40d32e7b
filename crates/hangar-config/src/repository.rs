//! The model repository (`model_repository`): a folder whose subfolders are models beside
//! the configured ones, as Triton's repository in its explicit-control mode and KServe's
//! multi-model agent (which downloads a model into `<repository>/<name>`) expect.
//!
//! A subfolder's name is the model's name. Its definition is `model_repository_defaults`
//! (the operator's, from the config) with the subfolder's `hangar.json` on top (one that
//! names another backend than the defaults' takes none of them). Without a
//! `model_path`, a GGUF engine's model is the one `.gguf` file the folder holds and any
//! other engine's is the folder itself. A folder whose definition does not hold is still a
//! model, one that never loads, carrying the reason ([`RepositoryModel::problem`]).
//!
//! What a folder may say is bounded ([`crate::folder`]): whoever can write the repository
//! (a download agent) is not the operator, so a `hangar.json` is held to an allow-list of
//! fields and to `model_repository_limits`, its paths stay inside the folder after symlinks,
//! and nothing in the folder may lead out of it or be other than a file or a folder.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::folder::{FOLDER_FIELDS, FolderRule, check_own, check_tree, inside, read_definition};
use crate::{
    BackendKind, DEFINITION_FILE, ModelConfig, ModelName, RepositoryLimits, ValidationError,
};

/// The `model_repository` setting: the folder, and the definition its subfolders start
/// from.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRepository {
    /// The folder (relative to the working directory when relative).
    pub dir: PathBuf,
    /// `model_repository_defaults`: model fields every subfolder's definition starts from;
    /// a subfolder without `hangar.json` takes them as they are.
    pub defaults: Option<Map<String, Value>>,
    /// `model_repository_limits`: the most a folder's own `hangar.json` may ask for.
    pub limits: RepositoryLimits,
}

/// One subfolder of the repository as a model.
#[derive(Debug, Clone, PartialEq)]
pub struct RepositoryModel {
    /// Its definition; when [`Self::problem`] is set, a stand-in that is never loaded
    /// (the backend the folder named, when it named one).
    pub definition: ModelConfig,
    /// Why the folder's model cannot load (a malformed `hangar.json`, no model file, …).
    pub problem: Option<String>,
}

impl ModelRepository {
    /// Every subfolder whose name is a model name, in name order, as a model; a name that
    /// `taken` (a configured model's name or alias) is left out, as is anything that is not
    /// a folder (or a link to one). An unreadable repository is an error; an entry that
    /// cannot be read is left out, and a folder that breaks a rule is a model with its
    /// reason.
    ///
    /// # Errors
    /// The I/O error reading the repository folder itself.
    pub fn scan(&self, taken: &dyn Fn(&str) -> bool) -> std::io::Result<Vec<RepositoryModel>> {
        let root = self.dir.canonicalize()?;
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&root)? {
            let Ok(entry) = entry else { continue };
            let Ok(name) = entry.file_name().into_string() else { continue };
            // A link is followed to see whether it is a folder; where it leads is checked
            // with the folder.
            if name.starts_with('.') || !entry.path().is_dir() || taken(&name) {
                continue;
            }
            if let Ok(name) = ModelName::new(name.as_str()) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names.into_iter().map(|name| self.model(&root, name)).collect())
    }

    /// The model of the subfolder `name` of `root` (the repository, resolved).
    fn model(&self, root: &Path, name: ModelName) -> RepositoryModel {
        let folder = root.join(name.as_str());
        let inside = resolved(root, &folder);
        let definition = inside.clone().and_then(|folder| {
            let value = self.definition(&folder)?;
            ModelConfig::parse(&name, &Value::Object(value)).map_err(|errors| {
                let prefix = format!("models.{name}.");
                let problems: Vec<String> = errors
                    .iter()
                    .map(|e| {
                        let path = e.path.strip_prefix(&prefix).unwrap_or(&e.path);
                        format!("{path}: {}", e.message)
                    })
                    .collect();
                format!("{DEFINITION_FILE}: {}", problems.join("; "))
            })
        });
        match definition {
            Ok(definition) => RepositoryModel { definition, problem: None },
            Err(problem) => RepositoryModel {
                definition: self.stand_in(&name, &folder, inside.is_ok()),
                problem: Some(problem),
            },
        }
    }

    /// The folder's definition as JSON: the defaults, its `hangar.json` on top (held to the
    /// folder rules, its paths resolved inside `folder`), and the model path.
    fn definition(&self, folder: &Path) -> Result<Map<String, Value>, String> {
        let mut value = self.defaults.clone().unwrap_or_default();
        let mut own_path = false;
        match read_definition(folder)? {
            Some(mut own) => {
                // Another engine than the defaults' takes none of them (their fields are
                // the defaults' engine's).
                if own.get("backend").is_some_and(|b| value.get("backend") != Some(b)) {
                    value.clear();
                }
                check_own(&own, &self.limits)?;
                for (field, rule) in FOLDER_FIELDS {
                    let Some(path) = own.get_mut(*field) else { continue };
                    if *rule != FolderRule::Path || path.is_null() {
                        continue;
                    }
                    let Value::String(text) = path else {
                        return Err(format!("{DEFINITION_FILE}: {field}: must be a string"));
                    };
                    let resolved = inside(folder, field, text)?;
                    *path = Value::String(resolved.to_string_lossy().into_owned());
                    own_path |= *field == "model_path";
                }
                value.extend(own);
            }
            None if self.defaults.is_none() => {
                return Err(format!(
                    "no {DEFINITION_FILE} in the folder, and no model_repository_defaults to serve it with"
                ));
            }
            None => {}
        }
        check_tree(folder)?;
        let path = match value.get("model_path") {
            Some(Value::String(path)) if own_path => PathBuf::from(path),
            Some(Value::String(path)) => inside(folder, "model_path", path)?,
            Some(_) => return Err(format!("{DEFINITION_FILE}: model_path: must be a string")),
            None => model_file(folder, &value)?,
        };
        value.insert("model_path".into(), Value::String(path.to_string_lossy().into_owned()));
        Ok(value)
    }

    /// A definition for a folder whose own does not hold: the backend it named (or the
    /// defaults'), else the stub; never loaded.
    /// Nothing is read from a folder that leads out of the repository (`inside` false).
    fn stand_in(&self, name: &ModelName, folder: &Path, inside: bool) -> ModelConfig {
        let own = inside.then(|| read_definition(folder).ok().flatten()).flatten();
        let named = own.and_then(|d| d.get("backend").cloned());
        let backend = named.or_else(|| self.defaults.as_ref()?.get("backend").cloned());
        let path = Value::String(folder.to_string_lossy().into_owned());
        let stand_in = |backend: Value| {
            let value = serde_json::json!({ "backend": backend, "model_path": path });
            ModelConfig::parse(name, &value).ok()
        };
        backend
            .and_then(stand_in)
            .or_else(|| stand_in(Value::String("stub".into())))
            .unwrap_or_else(|| unreachable!("a stub model with a path always parses"))
    }
}

/// Checks `model_repository_defaults` (at `path`) as a model definition without its
/// `model_path`, with the paths of its problems under `path`.
pub(crate) fn check_defaults(value: &Value, path: &str, errors: &mut Vec<ValidationError>) {
    let Value::Object(defaults) = value else { return };
    let name = ModelName::new("defaults").unwrap_or_else(|_| unreachable!("a valid name"));
    let mut probe = defaults.clone();
    probe.entry("model_path").or_insert_with(|| Value::String("/".into()));
    if let Err(problems) = ModelConfig::parse(&name, &Value::Object(probe)) {
        for e in problems {
            let field = e.path.strip_prefix("models.defaults").unwrap_or(&e.path);
            errors.push(ValidationError { path: format!("{path}{field}"), message: e.message });
        }
    }
}

/// `folder` (a subfolder of `root`, both resolved) with its links followed: still in
/// `root`.
fn resolved(root: &Path, folder: &Path) -> Result<PathBuf, String> {
    let resolved = folder.canonicalize().map_err(|e| format!("cannot resolve the folder: {e}"))?;
    if resolved.starts_with(root) && resolved != root {
        Ok(resolved)
    } else {
        Err(format!("the folder is a link out of the repository (to {})", resolved.display()))
    }
}

/// The model file of a folder without a `model_path`: a GGUF engine's one `.gguf` file
/// (the first part of a split one), else the folder itself.
fn model_file(folder: &Path, definition: &Map<String, Value>) -> Result<PathBuf, String> {
    let backend = definition.get("backend").and_then(|b| serde_json::from_value(b.clone()).ok());
    if !matches!(backend, Some(BackendKind::LlamaCpp | BackendKind::LlamaServer)) {
        return Ok(folder.to_path_buf());
    }
    let listing = std::fs::read_dir(folder).map_err(|e| format!("cannot list the folder: {e}"))?;
    let mut ggufs: Vec<String> = listing
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".gguf") && !n.starts_with("mmproj"))
        .filter(|n| !n.contains("-of-") || n.contains("-00001-of-"))
        .collect();
    ggufs.sort();
    match ggufs.as_slice() {
        [one] => Ok(folder.join(one)),
        [] => Err("no .gguf file in the folder".into()),
        many => Err(format!(
            "{} .gguf files in the folder ({}): name one with model_path in {DEFINITION_FILE}",
            many.len(),
            many.join(", ")
        )),
    }
}

#[cfg(test)]
#[path = "repository_tests.rs"]
mod tests;
