//! The worker program: the reference worker shipped inside this crate (written out to a
//! private directory on first use), or another one (the test worker), and how one replica's
//! worker is started.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hangar_backend::LoadError;
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

/// A private directory (mode 0700) for the worker package and the sockets of one backend,
/// removed when dropped: `<tmp>/hangar-bridge-<uid>/<pid>-<n>`. A `hangard` that was killed
/// cannot remove its own, so creating one also removes those of processes that are gone.
#[derive(Debug)]
pub(crate) struct PrivateDir {
    path: PathBuf,
    sockets: AtomicU64,
}

impl PrivateDir {
    /// Creates a fresh directory under the system's temporary directory.
    pub(crate) fn create() -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!("hangar-bridge-{}", nix::unistd::geteuid()));
        match std::fs::DirBuilder::new().mode(0o700).create(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Ours, and only ours: sockets and the worker's code live here.
        let meta = std::fs::symlink_metadata(&base)?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(std::io::Error::other(format!(
                "{} is not a directory of this user",
                base.display()
            )));
        }
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700))?;
        remove_orphans(&base);
        let unique = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = base.join(unique);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path, sockets: AtomicU64::new(0) })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh socket path in it.
    pub(crate) fn socket(&self) -> PathBuf {
        self.path.join(format!("w{}.sock", self.sockets.fetch_add(1, Ordering::Relaxed)))
    }
}

/// Removes the directories in `base` whose process (`<pid>-<n>`) no longer runs.
fn remove_orphans(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid =
            name.to_str().and_then(|n| n.split_once('-')).and_then(|(p, _)| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_dir_is_ours_alone_and_sweeps_those_of_dead_processes() {
        let first = PrivateDir::create().unwrap();
        let base = first.path().parent().unwrap().to_owned();
        // No process has this pid (pids stay below 2^22 on Linux).
        let orphan = base.join("999999999-0");
        std::fs::create_dir_all(orphan.join("hangar_bridge")).unwrap();
        let second = PrivateDir::create().unwrap();
        assert!(!orphan.exists(), "a dead process's directory is removed");
        assert!(first.path().exists(), "a live process's directory stays");
        assert_ne!(first.path(), second.path());
        let mode = std::fs::metadata(second.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let path = second.path().to_owned();
        drop(second);
        assert!(!path.exists(), "removed when dropped");
    }
}
