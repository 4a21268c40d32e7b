//! The model repository folder reader: a fuzzed `hangar.json` in a real folder that holds a
//! GGUF file, a subfolder and a link out of it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hangar_config::{FOLDER_FIELDS, FolderRule, ModelRepository, RepositoryLimits};
use serde_json::{Value, json};

/// The repository (made once per process): `m/` holds `m.gguf`, `w/weights.bin` and `out`, a
/// link to `/etc`.
fn repository() -> &'static (PathBuf, PathBuf) {
    static REPOSITORY: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    REPOSITORY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hangar-fuzz-folder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let folder = dir.join("m");
        std::fs::create_dir_all(folder.join("w")).expect("a temporary folder");
        std::fs::write(folder.join("m.gguf"), b"").expect("a file");
        std::fs::write(folder.join("w").join("weights.bin"), b"").expect("a file");
        std::os::unix::fs::symlink("/etc", folder.join("out")).expect("a link");
        let root = dir.canonicalize().expect("the folder resolves");
        (root.clone(), root.join("m"))
    })
}

/// `data` as the folder's `hangar.json`, read as a scan does (the defaults: `llama_cpp`).
///
/// Invariants: the folder is one model, named after it; one that holds sets no operator
/// field, no capped field past its limit, no name that reads as a flag or splits a list, and
/// every path it names lies inside the folder once resolved; one that does not hold says
/// why. The link out of the folder keeps the model from holding whatever the file says.
pub(crate) fn folder(data: &[u8]) {
    let (root, folder) = repository();
    std::fs::write(folder.join(hangar_config::DEFINITION_FILE), data).expect("written");
    let defaults = json!({ "backend": "llama_cpp" }).as_object().cloned();
    let limits = RepositoryLimits::default();
    let repo = ModelRepository { dir: root.clone(), defaults, limits };
    let models = repo.scan(&|name| name != "m").expect("the repository reads");
    let [model] = &models[..] else { panic!("one folder made {} models", models.len()) };
    assert_eq!(model.definition.name.as_str(), "m");
    // The link to /etc is in the folder: no definition may hold while it is there.
    let problem = model.problem.as_deref().expect("a folder with a link out of it held");
    assert!(!problem.is_empty(), "refused without a reason");
    // Without the link, what holds must keep the rules.
    let without = root.join("m-no-link");
    if !without.exists() {
        std::fs::create_dir_all(without.join("w")).expect("a folder");
        std::fs::write(without.join("m.gguf"), b"").expect("a file");
        std::fs::write(without.join("w").join("weights.bin"), b"").expect("a file");
    }
    std::fs::write(without.join(hangar_config::DEFINITION_FILE), data).expect("written");
    let models = repo.scan(&|name| name != "m-no-link").expect("the repository reads");
    let [model] = &models[..] else { panic!("one folder made {} models", models.len()) };
    match &model.problem {
        Some(problem) => assert!(!problem.is_empty(), "refused without a reason"),
        None => holds(&model.definition, &without, &limits),
    }
}

/// The rules a definition that holds keeps.
fn holds(model: &hangar_config::ModelConfig, folder: &Path, limits: &RepositoryLimits) {
    let raw = model.raw();
    for (field, rule) in FOLDER_FIELDS {
        let Some(value) = raw.get(*field).filter(|v| !v.is_null()) else { continue };
        match rule {
            FolderRule::Operator => panic!("a folder set the operator's `{field}`: {value}"),
            FolderRule::Capped(limit) => {
                let most = u64::from(limits.get(*limit));
                assert!(value.as_u64().is_none_or(|v| v <= most), "`{field}` = {value} > {most}");
            }
            FolderRule::Path => {
                let Value::String(path) = value else { panic!("`{field}` is not a path: {value}") };
                assert!(Path::new(path).starts_with(folder), "`{field}` = {path} is outside");
            }
            _ => {}
        }
    }
    let model_path = model.model_path.as_deref().expect("a GGUF model has a path");
    assert!(Path::new(model_path).starts_with(folder), "model_path {model_path} is outside");
    for name in std::iter::once(model.name.as_str()).chain(model.aliases.iter().map(|a| a.as_str()))
    {
        assert!(!name.starts_with('-') && !name.contains(','), "the name {name:?} was taken");
    }
}
