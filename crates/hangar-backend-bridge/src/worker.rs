//! The worker program: the reference worker shipped inside this crate (written out to a
//! private directory on first use), or another one (the test worker), and how one replica's
//! worker is started.

use std::path::Path;

use hangar_backend::LoadError;
pub(crate) use hangar_supervisor::PrivateDir;
use hangar_supervisor::{Launch, find_program};

/// The reference worker's files (`worker/hangar_bridge/`), compiled in so `hangard` is one
/// binary: (file name, source).
const REFERENCE_WORKER: &[(&str, &str)] = &[
    ("__init__.py", include_str!("../worker/hangar_bridge/__init__.py")),
    ("__main__.py", include_str!("../worker/hangar_bridge/__main__.py")),
    ("text.py", include_str!("../worker/hangar_bridge/text.py")),
    ("ct2.py", include_str!("../worker/hangar_bridge/ct2.py")),
    ("exllamav3.py", include_str!("../worker/hangar_bridge/exllamav3.py")),
    ("vllm.py", include_str!("../worker/hangar_bridge/vllm.py")),
];

/// Which worker program runs: the arguments after the interpreter (before `--socket PATH` or
/// `--check ENGINE`) and extra environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerProgram {
    /// Arguments after the interpreter.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

impl WorkerProgram {
    /// A worker script run as `python -u SCRIPT` (tests use one with no engine).
    pub fn script(path: impl AsRef<Path>, env: Vec<(String, String)>) -> Self {
        Self { args: vec!["-u".into(), path.as_ref().to_string_lossy().into_owned()], env }
    }

    /// The reference worker, written out under `dir`: `python -u -m hangar_bridge`.
    pub(crate) fn reference(dir: &Path) -> std::io::Result<Self> {
        let package = dir.join("hangar_bridge");
        std::fs::create_dir_all(&package)?;
        for (name, source) in REFERENCE_WORKER {
            std::fs::write(package.join(name), source)?;
        }
        let mut path = dir.to_string_lossy().into_owned();
        if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            path = format!("{path}:{}", old.to_string_lossy());
        }
        Ok(Self {
            args: vec!["-u".into(), "-m".into(), "hangar_bridge".into()],
            env: vec![("PYTHONPATH".into(), path)],
        })
    }

    /// The launch of this worker under `python` with `extra` arguments.
    pub(crate) fn launch(&self, python: &str, extra: &[&str]) -> Launch {
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Launch {
            program: python.to_owned(),
            args,
            env: self.env.clone(),
            pass_env: Vec::new(),
            library_path: None,
            host: String::new(),
            port: 0,
            socket: None,
            api_key: None,
        }
    }
}

/// The interpreter a model's worker runs under: `bridge_python`, else `python3` on `PATH`, as
/// an absolute path that keeps a virtualenv's symlink (so the venv's packages are seen).
pub(crate) fn python(configured: Option<&str>) -> Result<String, LoadError> {
    let program = configured.unwrap_or("python3");
    let found = find_program(
        program,
        "bridge_python",
        "the Python interpreter whose environment has the engine's packages",
    )?;
    Ok(std::path::absolute(&found).map_or(found, |p| p.to_string_lossy().into_owned()))
}
