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
//! What a folder may say is bounded: whoever can write the repository (a download agent)
//! is not the operator, so a `hangar.json` may not name programs, libraries, environment,
//! raw engine arguments, keys or remote servers ([`OPERATOR_ONLY`]), and its `model_path`
//! stays inside the folder.

use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use crate::{BackendKind, ModelConfig, ModelName, ValidationError};

/// The definition file of a repository subfolder.
pub const DEFINITION_FILE: &str = "hangar.json";

/// Largest `hangar.json` read, in bytes.
pub const MAX_DEFINITION_BYTES: u64 = 1 << 20;

/// The fields a `hangar.json` may not set: they name what runs (programs, libraries,
/// environment, raw arguments) or where credentials go, which only the operator's config
/// decides (`model_repository_defaults` may set them).
pub const OPERATOR_ONLY: &[&str] = &[
    "bridge_python",
    "vllm_binary_path",
    "vllm_library_path",
    "vllm_env",
    "vllm_extra_args",
    "vllm_api_key",
    "llama_server_binary_path",
    "llama_server_library_path",
    "llama_server_extra_args",
    "llama_server_backends",
    "llama_server_api_key",
    "openai_base_url",
    "openai_api_key",
    "openai_api_key_env",
];

/// The `model_repository` setting: the folder, and the definition its subfolders start
/// from.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRepository {
    /// The folder (relative to the working directory when relative).
    pub dir: PathBuf,
    /// `model_repository_defaults`: model fields every subfolder's definition starts from;
    /// a subfolder without `hangar.json` takes them as they are.
    pub defaults: Option<Map<String, Value>>,
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
    /// a folder. An unreadable repository is an error.
    ///
    /// # Errors
    /// The I/O error reading the repository folder itself.
    pub fn scan(&self, taken: &dyn Fn(&str) -> bool) -> std::io::Result<Vec<RepositoryModel>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else { continue };
            if name.starts_with('.') || !entry.path().is_dir() || taken(&name) {
                continue;
            }
            if let Ok(name) = ModelName::new(name.as_str()) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names.into_iter().map(|name| self.model(name)).collect())
    }

    /// The model of the subfolder `name`.
    fn model(&self, name: ModelName) -> RepositoryModel {
        let folder = self.dir.join(name.as_str());
        let definition = self.definition(&folder).and_then(|value| {
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
                definition: self.stand_in(&name, &folder),
                problem: Some(problem),
            },
        }
    }

    /// The folder's definition as JSON: the defaults, its `hangar.json` on top, and the
    /// model path.
    fn definition(&self, folder: &Path) -> Result<Map<String, Value>, String> {
        let mut value = self.defaults.clone().unwrap_or_default();
        match read_definition(folder)? {
            Some(own) => {
                // Another engine than the defaults' takes none of them (their fields are
                // the defaults' engine's).
                if own.get("backend").is_some_and(|b| value.get("backend") != Some(b)) {
                    value.clear();
                }
                if let Some(key) = own.keys().find(|k| OPERATOR_ONLY.contains(&k.as_str())) {
                    return Err(format!(
                        "{DEFINITION_FILE}: `{key}` is the operator's to set (in model_repository_defaults), not a repository folder's"
                    ));
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
        let path = match value.get("model_path") {
            Some(Value::String(path)) => inside(folder, path)?,
            Some(_) => return Err(format!("{DEFINITION_FILE}: model_path: must be a string")),
            None => model_file(folder, &value)?,
        };
        value.insert("model_path".into(), Value::String(path.to_string_lossy().into_owned()));
        Ok(value)
    }

    /// A definition for a folder whose own does not hold: the backend it named (or the
    /// defaults'), else the stub; never loaded.
    fn stand_in(&self, name: &ModelName, folder: &Path) -> ModelConfig {
        let named = read_definition(folder).ok().flatten().and_then(|d| d.get("backend").cloned());
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

/// The folder's `hangar.json` as an object, if it has one.
fn read_definition(folder: &Path) -> Result<Option<Map<String, Value>>, String> {
    let path = folder.join(DEFINITION_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{DEFINITION_FILE}: cannot read: {e}")),
    };
    let mut text = String::new();
    let read = std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_DEFINITION_BYTES + 1),
        &mut text,
    );
    read.map_err(|e| format!("{DEFINITION_FILE}: cannot read: {e}"))?;
    if text.len() as u64 > MAX_DEFINITION_BYTES {
        return Err(format!("{DEFINITION_FILE}: larger than {MAX_DEFINITION_BYTES} bytes"));
    }
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(format!("{DEFINITION_FILE}: must be a JSON object (one model definition)")),
        Err(e) => Err(format!("{DEFINITION_FILE}:{}:{}: {e}", e.line(), e.column())),
    }
}

/// `path` of a `hangar.json`, resolved in `folder`: relative, and inside it.
fn inside(folder: &Path, path: &str) -> Result<PathBuf, String> {
    let relative = Path::new(path);
    let stays =
        relative.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !stays {
        return Err(format!(
            "{DEFINITION_FILE}: model_path: must be a path inside the folder (relative, without `..`), not {path:?}"
        ));
    }
    Ok(folder.join(relative))
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
mod tests {
    use super::*;
    use serde_json::json;

    /// A repository in a fresh folder, with `defaults`.
    fn repository(label: &str, defaults: Option<Value>) -> ModelRepository {
        let dir = std::env::temp_dir().join(format!("hangar-repo-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let defaults = defaults.map(|d| d.as_object().unwrap().clone());
        ModelRepository { dir, defaults }
    }

    /// A subfolder `name` holding `files` (name, contents).
    fn folder(repo: &ModelRepository, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = repo.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        dir
    }

    fn scan(repo: &ModelRepository) -> Vec<(String, Option<String>, Option<String>)> {
        repo.scan(&|name| name == "configured")
            .unwrap()
            .into_iter()
            .map(|m| (m.definition.name.to_string(), m.definition.model_path, m.problem))
            .collect()
    }

    #[test]
    fn each_folder_is_a_model_from_the_defaults_its_definition_file_and_its_one_gguf() {
        let repo = repository("ok", Some(json!({ "backend": "llama_cpp", "gguf_n_ctx": 2048 })));
        let one = folder(&repo, "one", &[("m.gguf", ""), ("mmproj-m.gguf", ""), ("README", "")]);
        let split =
            folder(&repo, "split", &[("m-00001-of-00002.gguf", ""), ("m-00002-of-00002.gguf", "")]);
        let own =
            folder(&repo, "own", &[("hangar.json", r#"{"backend": "stub", "model_path": "w"}"#)]);
        folder(&repo, "configured", &[("m.gguf", "")]);
        folder(&repo, ".hidden", &[("m.gguf", "")]);
        std::fs::write(repo.dir.join("loose.gguf"), "").unwrap();
        let path = |p: PathBuf| Some(p.to_string_lossy().into_owned());
        assert_eq!(
            scan(&repo),
            [
                ("one".into(), path(one.join("m.gguf")), None),
                ("own".into(), path(own.join("w")), None),
                ("split".into(), path(split.join("m-00001-of-00002.gguf")), None),
            ]
        );
        let models = repo.scan(&|_| false).unwrap();
        let one = models.iter().find(|m| m.definition.name.as_str() == "one").unwrap();
        assert_eq!(one.definition.definition()["gguf_n_ctx"], 2048, "the defaults apply");
    }

    #[test]
    fn a_folder_whose_definition_does_not_hold_is_a_model_with_its_reason() {
        let repo = repository("bad", Some(json!({ "backend": "llama_cpp" })));
        folder(&repo, "none", &[]);
        folder(&repo, "two", &[("a.gguf", ""), ("b.gguf", "")]);
        folder(&repo, "broken", &[("hangar.json", "{ not json")]);
        folder(&repo, "array", &[("hangar.json", "[]")]);
        folder(&repo, "field", &[("hangar.json", r#"{"gguf_n_ctx": 0}"#), ("m.gguf", "")]);
        folder(
            &repo,
            "binary",
            &[(
                "hangar.json",
                r#"{"backend": "llama_server", "llama_server_binary_path": "/bin/sh"}"#,
            )],
        );
        folder(&repo, "escape", &[("hangar.json", r#"{"model_path": "../other/m.gguf"}"#)]);
        folder(&repo, "absolute", &[("hangar.json", r#"{"model_path": "/etc/passwd"}"#)]);
        let big = format!("{{\"x\": \"{}\"}}", "a".repeat(MAX_DEFINITION_BYTES as usize));
        folder(&repo, "huge", &[("hangar.json", &big)]);
        let problems: Vec<(String, String)> = scan(&repo)
            .into_iter()
            .map(|(name, _, problem)| (name, problem.expect("a problem")))
            .collect();
        let expect = [
            ("absolute", "must be a path inside the folder"),
            ("array", "must be a JSON object"),
            ("binary", "`llama_server_binary_path` is the operator's to set"),
            ("broken", "hangar.json:1:3"),
            ("escape", "must be a path inside the folder"),
            ("field", "gguf_n_ctx: must be >= 1"),
            ("huge", "larger than 1048576 bytes"),
            ("none", "no .gguf file in the folder"),
            ("two", "2 .gguf files in the folder (a.gguf, b.gguf)"),
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:?}");
        for ((name, problem), (want_name, want)) in problems.iter().zip(expect) {
            assert_eq!(name, want_name);
            assert!(problem.contains(want), "{name}: {problem}");
        }
        // Stand-ins keep the backend the folder (or the defaults) named.
        let binary = repo.scan(&|_| false).unwrap();
        let binary = binary.iter().find(|m| m.definition.name.as_str() == "binary").unwrap();
        assert_eq!(binary.definition.backend, BackendKind::LlamaServer);
    }

    #[test]
    fn without_defaults_a_folder_needs_its_definition_file() {
        let repo = repository("bare", None);
        folder(&repo, "bare", &[("m.gguf", "")]);
        let [(name, _, problem)] = &scan(&repo)[..] else { panic!("one model") };
        assert_eq!(name, "bare");
        assert!(
            problem.as_deref().unwrap().contains("no model_repository_defaults"),
            "{problem:?}"
        );
        assert!(repository("gone", None).dir.exists());
        let missing = ModelRepository { dir: repo.dir.join("missing"), defaults: None };
        assert!(missing.scan(&|_| false).is_err(), "an unreadable repository is an error");
    }

    #[test]
    fn the_defaults_are_checked_as_a_model_definition_at_their_own_path() {
        let config = json!({ "model_repository": "/m",
            "model_repository_defaults": { "backend": "llama_cpp", "gguf_n_ctx": 0, "colour": 1 } });
        let Err(crate::ConfigError::Invalid(errors)) = crate::Config::from_value(&config) else {
            panic!("invalid defaults are a config error")
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["model_repository_defaults.colour", "model_repository_defaults.gguf_n_ctx"]
        );
        let ok =
            json!({ "model_repository": "/m", "model_repository_defaults": { "backend": "stub" } });
        let repository = crate::Config::from_value(&ok).unwrap().model_repository.unwrap();
        assert_eq!(repository.dir, Path::new("/m"));
    }
}
