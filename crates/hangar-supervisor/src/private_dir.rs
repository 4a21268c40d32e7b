//! [`PrivateDir`]: a directory only Hangar's user can enter, for children's sockets.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A private directory (mode 0700) for what a child reaches Hangar through or is started
/// from (a bridge's worker package and sockets, a `vllm serve` child's socket), removed when
/// dropped: `<tmp>/hangar-children-<uid>/<pid>-<n>`. A `hangard` that was killed cannot
/// remove its own, so creating one also removes those of processes that are gone.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    sockets: AtomicU64,
}

impl PrivateDir {
    /// Creates a fresh directory under the system's temporary directory.
    pub fn create() -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!("hangar-children-{}", nix::unistd::geteuid()));
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
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh socket path in it.
    pub fn socket(&self) -> PathBuf {
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
