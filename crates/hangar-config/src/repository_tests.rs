//! The repository scan and the folder rules, on real folders: every field, path, link and
//! file kind a folder writer could use to reach outside its folder or hang the reader.

use super::*;
use crate::MAX_DEFINITION_BYTES;
use serde_json::json;

/// A repository in a fresh folder, with `defaults`.
fn repository(label: &str, defaults: Option<Value>) -> ModelRepository {
    let dir = std::env::temp_dir().join(format!("hangar-repo-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let defaults = defaults.map(|d| d.as_object().unwrap().clone());
    ModelRepository { dir, defaults, limits: RepositoryLimits::default() }
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
    let own = folder(
        &repo,
        "own",
        &[("hangar.json", r#"{"backend": "stub", "model_path": "w"}"#), ("w", "")],
    );
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
        &[("hangar.json", r#"{"backend": "llama_server", "llama_server_binary_path": "/bin/sh"}"#)],
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
    assert!(problem.as_deref().unwrap().contains("no model_repository_defaults"), "{problem:?}");
    assert!(repository("gone", None).dir.exists());
    let missing = ModelRepository {
        dir: repo.dir.join("missing"),
        defaults: None,
        limits: RepositoryLimits::default(),
    };
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
    assert_eq!(paths, ["model_repository_defaults.colour", "model_repository_defaults.gguf_n_ctx"]);
    let ok =
        json!({ "model_repository": "/m", "model_repository_defaults": { "backend": "stub" } });
    let repository = crate::Config::from_value(&ok).unwrap().model_repository.unwrap();
    assert_eq!(repository.dir, Path::new("/m"));
}

/// The problem of the folder model `name`, scanned from `repo`.
fn problem_of(repo: &ModelRepository, name: &str) -> Option<String> {
    let models = repo.scan(&|_| false).unwrap();
    let model = models.iter().find(|m| m.definition.name.as_str() == name);
    model.unwrap_or_else(|| panic!("no model {name}")).problem.clone()
}

#[test]
fn every_known_field_has_a_folder_rule_and_the_rules_name_only_known_fields() {
    let known: std::collections::BTreeSet<&str> = crate::validate::MODEL_SECTIONS
        .iter()
        .flat_map(|s| s.fields.iter().map(String::as_str))
        .collect();
    let listed: std::collections::BTreeSet<&str> =
        crate::FOLDER_FIELDS.iter().map(|(f, _)| *f).collect();
    assert_eq!(listed.len(), crate::FOLDER_FIELDS.len(), "a field is listed twice");
    // A field added to the definition must be given a rule here before a folder may set it.
    assert_eq!(known, listed);
}

#[test]
fn a_folder_may_set_only_listed_fields_and_no_operator_field() {
    let repo = repository("allow", Some(json!({ "backend": "vllm_serve" })));
    let operator: Vec<&str> = crate::FOLDER_FIELDS
        .iter()
        .filter(|(_, rule)| *rule == crate::FolderRule::Operator)
        .map(|(f, _)| *f)
        .collect();
    for field in ["pinned", "allow_remote_media", "vllm_model", "llama_server_host", "gpus"] {
        assert!(operator.contains(&field), "{field} is the operator's");
    }
    for (i, field) in operator.iter().enumerate() {
        let name = format!("op{i}");
        let text = json!({ *field: "--x" }).to_string();
        folder(&repo, &name, &[("hangar.json", &text)]);
        let problem = problem_of(&repo, &name).unwrap_or_else(|| panic!("{field} was taken"));
        assert!(problem.contains(&format!("`{field}` is the operator's")), "{problem}");
    }
    // A field nobody listed (one added later, say) is refused as such.
    folder(&repo, "later", &[("hangar.json", r#"{"adapters": ["x"]}"#)]);
    let problem = problem_of(&repo, "later").unwrap();
    assert!(problem.contains("`adapters` is not a field a repository folder may set"), "{problem}");
}

#[test]
fn capped_fields_pass_at_the_operators_limit_and_are_refused_one_over() {
    let mut repo =
        repository("caps", Some(json!({ "backend": "llama_cpp", "target_inflight": 8 })));
    repo.limits = RepositoryLimits {
        replicas: 2,
        target_inflight: 4,
        context_tokens: 4096,
        load_timeout_s: 60,
    };
    let cases = [
        ("replicas", 2, 3, "model_repository_limits.replicas (2)"),
        ("replica_max", 2, 3, "model_repository_limits.replicas (2)"),
        ("target_inflight", 4, 5, "model_repository_limits.target_inflight (4)"),
        ("gguf_n_ctx", 4096, 4097, "model_repository_limits.context_tokens (4096)"),
        ("load_timeout_s", 60, 61, "model_repository_limits.load_timeout_s (60)"),
    ];
    for (field, at, over, limit) in cases {
        let at_cap = format!("{field}-at");
        folder(
            &repo,
            &at_cap,
            &[("hangar.json", &json!({ field: at }).to_string()), ("m.gguf", "")],
        );
        assert_eq!(problem_of(&repo, &at_cap), None, "{field} at its cap");
        let one_over = format!("{field}-over");
        folder(
            &repo,
            &one_over,
            &[("hangar.json", &json!({ field: over }).to_string()), ("m.gguf", "")],
        );
        let problem = problem_of(&repo, &one_over).unwrap_or_else(|| panic!("{field} over"));
        assert!(problem.contains(limit), "{field}: {problem}");
    }
    // The operator's defaults are not held to the limits (8 in flight above).
    folder(&repo, "plain", &[("m.gguf", "")]);
    assert_eq!(problem_of(&repo, "plain"), None);
}

#[test]
fn every_path_field_must_stay_in_the_folder_after_links() {
    use std::os::unix::fs::symlink;
    let repo = repository("paths", Some(json!({ "backend": "llama_server" })));
    let outside = repo.dir.join("..").join(format!("hangar-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.gguf"), "").unwrap();
    let paths: Vec<&str> = crate::FOLDER_FIELDS
        .iter()
        .filter(|(_, rule)| *rule == crate::FolderRule::Path)
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(
        paths,
        ["model_path", "llama_server_mmproj", "llama_server_draft_model", "vllm_speculative_model"]
    );
    for field in paths {
        let backend = if field.starts_with("vllm") { "vllm_serve" } else { "llama_server" };
        let name = format!("link-{field}");
        let text = json!({ "backend": backend, field: "out.gguf" }).to_string();
        let dir = folder(&repo, &name, &[("hangar.json", &text), ("m.gguf", "")]);
        symlink(outside.join("secret.gguf"), dir.join("out.gguf")).unwrap();
        let problem = problem_of(&repo, &name).unwrap_or_else(|| panic!("{field} led out"));
        assert!(
            problem.contains(&format!("{field}: \"out.gguf\" leads out of the folder")),
            "{problem}"
        );
        for bad in ["--help", "../x", "/etc/passwd"] {
            let name = format!("text-{field}-{}", bad.len());
            let text = json!({ "backend": backend, field: bad }).to_string();
            folder(&repo, &name, &[("hangar.json", &text), ("m.gguf", "")]);
            assert!(problem_of(&repo, &name).is_some(), "{field} = {bad:?} was taken");
        }
    }
    // A link that stays inside is followed, and the resolved path is what the engine gets.
    let dir =
        folder(&repo, "inner", &[("hangar.json", r#"{"model_path": "l.gguf"}"#), ("m.gguf", "")]);
    symlink(dir.join("m.gguf"), dir.join("l.gguf")).unwrap();
    let models = repo.scan(&|_| false).unwrap();
    let inner = models.iter().find(|m| m.definition.name.as_str() == "inner").unwrap();
    assert_eq!(inner.problem, None);
    let resolved = dir.canonicalize().unwrap().join("m.gguf");
    assert_eq!(inner.definition.model_path.as_deref(), resolved.to_str());
    // Nothing else in the folder may lead out either: a linked tokenizer, a linked folder.
    let dir = folder(&repo, "tree", &[("m.gguf", "")]);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    symlink("/etc/passwd", dir.join("sub").join("tokenizer.json")).unwrap();
    let problem = problem_of(&repo, "tree").unwrap();
    assert!(problem.contains("`sub/tokenizer.json` is a link out of the folder"), "{problem}");
    // A model folder that is itself a link out of the repository.
    symlink(&outside, repo.dir.join("away")).unwrap();
    let problem = problem_of(&repo, "away").unwrap();
    assert!(problem.contains("the folder is a link out of the repository"), "{problem}");
    std::fs::remove_dir_all(&outside).unwrap();
}

#[test]
fn a_pipe_a_link_or_a_huge_definition_file_is_refused_without_reading_it() {
    use std::os::unix::fs::symlink;
    let repo = repository("files", Some(json!({ "backend": "llama_cpp" })));
    let mkfifo = |path: &Path| {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success());
    };
    // A named pipe called hangar.json: opening it would wait for a writer for ever.
    let pipe = folder(&repo, "pipe", &[("m.gguf", "")]);
    mkfifo(&pipe.join(DEFINITION_FILE));
    // A pipe among the weights: Hangar's own header reads would wait on it too.
    let weights = folder(&repo, "weights", &[("hangar.json", r#"{"model_path": "m.gguf"}"#)]);
    mkfifo(&weights.join("m.gguf"));
    // A sparse 1 GiB hangar.json: refused by its size, never read.
    let huge = folder(&repo, "huge", &[("m.gguf", "")]);
    let file = std::fs::File::create(huge.join(DEFINITION_FILE)).unwrap();
    file.set_len(1 << 30).unwrap();
    // A hangar.json that is a link (to a file inside, even).
    let linked = folder(&repo, "linked", &[("m.gguf", ""), ("real.json", "{}")]);
    symlink(linked.join("real.json"), linked.join(DEFINITION_FILE)).unwrap();
    let started = std::time::Instant::now();
    let expect = [
        ("pipe", "hangar.json: is not a regular file"),
        ("weights", "`m.gguf` is not a regular file"),
        ("huge", "larger than 1048576 bytes"),
        ("linked", "hangar.json: is a symbolic link"),
    ];
    for (name, want) in expect {
        let problem = problem_of(&repo, name).unwrap_or_else(|| panic!("{name} was taken"));
        assert!(problem.contains(want), "{name}: {problem}");
    }
    // Generous: a hang would be for ever; a read of 1 GiB would take seconds.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn folders_over_the_entry_or_depth_bound_are_refused() {
    let repo = repository("bounds", Some(json!({ "backend": "stub" })));
    let deep = folder(&repo, "deep", &[]);
    let mut dir = deep.clone();
    for i in 0..crate::MAX_FOLDER_DEPTH {
        dir = dir.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&dir).unwrap();
    let problem = problem_of(&repo, "deep").unwrap();
    assert!(problem.contains("nests more than 8 deep"), "{problem}");
    let wide = folder(&repo, "wide", &[]);
    for i in 0..=crate::MAX_FOLDER_ENTRIES {
        std::fs::File::create(wide.join(format!("f{i}"))).unwrap();
    }
    let problem = problem_of(&repo, "wide").unwrap();
    assert!(problem.contains("more than 10000 entries"), "{problem}");
    std::fs::remove_file(wide.join("f0")).unwrap();
    assert_eq!(problem_of(&repo, "wide"), None, "at the bound");
}
