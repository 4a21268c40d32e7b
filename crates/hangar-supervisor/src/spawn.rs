//! Starting an engine process without copying Hangar: `clone(CLONE_VM | CLONE_VFORK)`, the
//! way `posix_spawn` starts a child, plus the two steps `posix_spawn` cannot take — the death
//! signal and the check that Hangar is still its parent.
//!
//! `std::process::Command` can only set a death signal through `pre_exec`, and a `pre_exec`
//! hook makes it `fork()`: the kernel copies the page tables of the whole of `hangard`
//! (the in-process engine's KV caches included) before the child can `exec`. Measured on a
//! small process (20 MB touched) that is 2.4 ms against 0.15 ms for a spawn without the hook,
//! and it grows with every gigabyte `hangard` holds. Here the child borrows Hangar's memory
//! until its `execve` while the spawning thread waits (as with vfork); in between it runs only
//! async-signal-safe system calls on a stack of its own, reads nothing but the prepared
//! [`Plan`], and reports a failed step through a pipe.
// The one place in Hangar with unsafe code: the child's side of a vfork-style spawn.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, PipeReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::ptr;

use hangar_config::ChildEnv;
use libc::{c_char, c_int, c_void};

/// The child's stack until it `exec`s: a few system calls deep.
const STACK: usize = 128 * 1024;
/// Signals 1..NSIG on Linux.
const NSIG: c_int = 65;

/// A started child: its pid (also its process group) and the read ends of its output.
pub(crate) struct Spawned {
    pub(crate) pid: i32,
    pub(crate) stdout: PipeReader,
    pub(crate) stderr: PipeReader,
}

/// What the child needs, prepared (allocated) before it exists.
pub(crate) struct Plan {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Plan {
    /// `program` (looked up on the child's `PATH` when it has no `/`) with `args`, in the
    /// part of Hangar's environment that `inherit` passes (with the model's `own` names),
    /// with `env` set over it.
    ///
    /// # Errors
    /// A program not found on `PATH`, or a NUL byte in an argument or variable.
    pub(crate) fn new(
        program: &str,
        args: &[String],
        env: &[(String, String)],
        inherit: &ChildEnv,
        own: &[String],
    ) -> io::Result<Self> {
        let vars = environment(inherit, own, env);
        let path = resolve(program, vars.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v))?;
        let c = |bytes: Vec<u8>| {
            CString::new(bytes).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte")
            })
        };
        let argv = std::iter::once(program)
            .chain(args.iter().map(String::as_str))
            .map(|a| c(a.as_bytes().to_vec()))
            .collect::<io::Result<_>>()?;
        let envp = vars
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k.into_vec();
                kv.push(b'=');
                kv.extend(v.into_vec());
                c(kv)
            })
            .collect::<io::Result<_>>()?;
        Ok(Self { path: c(path.into_os_string().into_vec())?, argv, envp })
    }
}

/// A child's environment: Hangar's variables that `inherit` passes for a model whose own
/// `pass_env` is `own`, then `env` (which wins).
pub(crate) fn environment(
    inherit: &ChildEnv,
    own: &[String],
    env: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k.to_str().is_some_and(|k| inherit.passes_for(own, k)))
        .filter(|(k, _)| !env.iter().any(|(set, _)| OsStr::new(set) == k))
        .collect();
    vars.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
    vars
}

/// `program` itself when it names a path, else the first executable file of that name in
/// `path_var` (or `/usr/local/bin:/usr/bin:/bin` without one).
fn resolve(program: &str, path_var: Option<&OsString>) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let default = OsString::from("/usr/local/bin:/usr/bin:/bin");
    std::env::split_paths(path_var.unwrap_or(&default))
        .map(|dir| dir.join(program))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("`{program}` not found on PATH"))
        })
}

/// The child's side, passed through `clone`'s argument pointer.
struct ChildArgs {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    stdin: c_int,
    stdout: c_int,
    stderr: c_int,
    /// Write end of the report pipe: `[step, errno]` when a step fails.
    report: c_int,
    /// Hangar's pid: the child's parent unless Hangar has died.
    parent: libc::pid_t,
}

/// The steps a child reports a failure of.
const STEP_GROUP: c_int = 1;
const STEP_DEATH_SIGNAL: c_int = 2;
const STEP_ORPHANED: c_int = 3;
const STEP_STDIO: c_int = 4;
const STEP_EXEC: c_int = 5;

/// Starts `plan` in a new process group with SIGKILL as its death signal (fired when the
/// calling thread ends), stdin from `/dev/null`, stdout and stderr into pipes. Returns once
/// the child has `exec`ed, or with why it could not.
///
/// # Errors
/// Pipe or clone failures, and the child's failed step (most often `execve`'s errno).
pub(crate) fn spawn(plan: &Plan) -> io::Result<Spawned> {
    let argv = pointers(&plan.argv);
    let envp = pointers(&plan.envp);
    let stdin = File::open("/dev/null")?;
    let (stdout, out_w) = io::pipe()?;
    let (stderr, err_w) = io::pipe()?;
    let (mut report_r, report_w) = io::pipe()?;
    let mut args = ChildArgs {
        path: plan.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdin: stdin.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        report: report_w.as_raw_fd(),
        parent: std::process::id() as libc::pid_t,
    };
    let mut stack = vec![0u8; STACK];
    // The stack grows down on every Linux target Hangar builds for; 16-byte aligned top.
    let top = ((stack.as_mut_ptr() as usize + STACK) & !15) as *mut c_void;
    // SAFETY: every signal is blocked around the clone so no handler of Hangar's runs in the
    // child, which shares Hangar's memory; the child runs `child` on its own `stack` and only
    // reads `args`, `argv` and `envp`, which outlive it: CLONE_VFORK suspends this thread
    // until the child has exec'd or exited. The old mask is restored before returning.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            ptr::addr_of_mut!(args).cast(),
        );
        let error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        if pid < 0 {
            return Err(error);
        }
        pid
    };
    drop((stdin, out_w, err_w, report_w, stack));
    let mut report = [0u8; 8];
    match report_r.read_exact(&mut report) {
        // The report pipe closed at exec: the child runs the engine.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Spawned { pid, stdout, stderr }),
        Err(e) => Err(e),
        Ok(()) => {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            let step = c_int::from_ne_bytes(report[..4].try_into().unwrap_or_default());
            let errno = c_int::from_ne_bytes(report[4..].try_into().unwrap_or_default());
            Err(failed_step(step, errno))
        }
    }
}

/// The error of a child's failed step.
fn failed_step(step: c_int, errno: c_int) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    match step {
        STEP_EXEC => os,
        STEP_ORPHANED => io::Error::other("Hangar exited while the engine started"),
        STEP_GROUP => io::Error::new(os.kind(), format!("setpgid: {os}")),
        STEP_DEATH_SIGNAL => io::Error::new(os.kind(), format!("prctl(PR_SET_PDEATHSIG): {os}")),
        STEP_STDIO => io::Error::new(os.kind(), format!("dup2: {os}")),
        _ => io::Error::other(format!("the child failed at step {step}: {os}")),
    }
}

/// A NULL-terminated array of pointers into `strings`.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(ptr::null())).collect()
}

/// The child, between `clone` and `execve`: default signal dispositions, its own process
/// group, SIGKILL when the spawning thread ends, stdio, an empty signal mask, `execve`.
/// Only async-signal-safe calls; no allocation, no Rust runtime.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while the parent is suspended; every
    // call below is an async-signal-safe system call on memory prepared by the parent.
    unsafe {
        let args = &*arg.cast::<ChildArgs>();
        let fail = |step: c_int| -> c_int {
            let errno = *libc::__errno_location();
            let mut report = [0u8; 8];
            report[..4].copy_from_slice(&step.to_ne_bytes());
            report[4..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(args.report, report.as_ptr().cast(), report.len());
            libc::_exit(127)
        };
        // Hangar's handlers must not run here, nor its ignored signals (SIGPIPE) stay ignored
        // in the engine. SIGKILL, SIGSTOP and libc's internal signals refuse: that is fine.
        for signal in 1..NSIG {
            libc::signal(signal, libc::SIG_DFL);
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(STEP_GROUP);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return fail(STEP_DEATH_SIGNAL);
        }
        // Hangar died before the death signal was set: it will never come.
        if libc::getppid() != args.parent {
            *libc::__errno_location() = libc::ESRCH;
            return fail(STEP_ORPHANED);
        }
        for (from, to) in [(args.stdin, 0), (args.stdout, 1), (args.stderr, 2)] {
            // dup2 onto itself keeps close-on-exec: clear it instead.
            let done =
                if from == to { libc::fcntl(to, libc::F_SETFD, 0) } else { libc::dup2(from, to) };
            if done < 0 {
                return fail(STEP_STDIO);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, ptr::null_mut());
        libc::execve(args.path, args.argv, args.envp);
        fail(STEP_EXEC)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitStatus, waitpid};
    use nix::unistd::Pid;

    use super::*;

    fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> io::Result<Spawned> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let env: Vec<_> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        spawn(&Plan::new(program, &args, &env, &ChildEnv::default(), &[])?)
    }

    fn wait(pid: i32) -> WaitStatus {
        waitpid(Pid::from_raw(pid), None).unwrap()
    }

    /// `key:` of `/proc/<pid>/status`.
    fn status_field(pid: i32, key: &str) -> String {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line[key.len()..].trim().to_owned()
    }

    #[test]
    fn the_child_gets_its_arguments_environment_and_output_pipes() {
        let script = r#"echo "$0|$1|$FOO|${HOME:+home}"; echo err >&2; read x || echo eof"#;
        let mut child = run("sh", &["-c", script, "zero", "one"], &[("FOO", "bar baz")]).unwrap();
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.read_to_string(&mut out).unwrap();
        child.stderr.read_to_string(&mut err).unwrap();
        // $0 is the first argument after -c's script; HOME comes from Hangar's environment;
        // stdin is /dev/null.
        assert_eq!(out, "zero|one|bar baz|home\neof\n");
        assert_eq!(err, "err\n");
        assert_eq!(wait(child.pid), WaitStatus::Exited(Pid::from_raw(child.pid), 0));
    }

    #[test]
    fn the_child_leads_its_own_group_with_default_signals_and_an_empty_mask() {
        let child = run("sleep", &["30"], &[]).unwrap();
        let pid = Pid::from_raw(child.pid);
        assert_eq!(nix::unistd::getpgid(Some(pid)).unwrap(), pid);
        // The test harness ignores SIGPIPE, as every Rust program does: the engine must not.
        // (Signals 32 and up are libc's own; an ignored one stays so, as with posix_spawn.)
        let ignored = u64::from_str_radix(&status_field(child.pid, "SigIgn:"), 16).unwrap();
        assert_eq!(ignored & 0x7fff_ffff, 0, "ignored: {ignored:#x}");
        assert_eq!(status_field(child.pid, "SigBlk:"), "0000000000000000");
        nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
        assert_eq!(wait(child.pid), WaitStatus::Signaled(pid, Signal::SIGTERM, false));
    }

    #[test]
    fn the_child_dies_with_the_thread_that_spawned_it() {
        let child = std::thread::spawn(|| run("sleep", &["30"], &[]).unwrap()).join().unwrap();
        let pid = Pid::from_raw(child.pid);
        let started = Instant::now();
        assert_eq!(wait(child.pid), WaitStatus::Signaled(pid, Signal::SIGKILL, false));
        assert!(started.elapsed() < Duration::from_secs(20), "the death signal never came");
    }

    #[test]
    fn failures_are_reported_with_the_os_error() {
        let missing = run("no-such-engine-anywhere", &[], &[]).err().unwrap();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(missing.to_string().contains("`no-such-engine-anywhere` not found on PATH"));
        // Not executable: execve's own errno comes back through the report pipe.
        let dir = std::env::temp_dir().join(format!("hangar-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("engine");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let denied = run(file.to_str().unwrap(), &[], &[]).err().unwrap();
        assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied, "{denied}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(Plan::new("sh", &["a\0b".to_owned()], &[], &ChildEnv::default(), &[]).is_err());
    }
}
