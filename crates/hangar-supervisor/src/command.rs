//! [`Launch`]: how one engine process is started — program, argv, environment, address —
//! and [`find_program`], which resolves the program.

use std::path::{Path, PathBuf};

use hangar_backend::LoadError;

/// Host children listen on when the config names none.
pub const LOOPBACK: &str = "127.0.0.1";

/// Everything needed to start one engine process.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The executable.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the API key travels here, never in argv, which every
    /// local user can read in `/proc/<pid>/cmdline`).
    pub env: Vec<(String, String)>,
    /// Variables of Hangar's environment the child gets beyond the spawner's rules (its
    /// model's `pass_env`).
    pub pass_env: Vec<String>,
    /// Prepended to `LD_LIBRARY_PATH`.
    pub library_path: Option<String>,
    /// Where the child listens.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The Unix socket it listens on instead of `host:port`, when it has one.
    pub socket: Option<PathBuf>,
    /// The bearer key the child requires: the configured one, else a fresh random key only
    /// Hangar knows.
    pub api_key: Option<String>,
}

impl Launch {
    /// The child's OpenAI base URL (`http://host:port/v1`; `http://localhost/v1` on its
    /// Unix socket).
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.origin())
    }

    /// The child's health route.
    pub fn health_url(&self) -> String {
        format!("{}/health", self.origin())
    }

    /// `http://host:port`, or `http://localhost` for a child on a Unix socket (the URL's
    /// authority is then only its `Host` header).
    fn origin(&self) -> String {
        if self.socket.is_some() {
            return "http://localhost".to_owned();
        }
        let host = if self.host == "0.0.0.0" { LOOPBACK } else { self.host.as_str() };
        format!("http://{host}:{}", self.port)
    }

    /// The command line as one shell-like string (for logs; the key is not in it).
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `program` itself when it names a file (a path with a `/`), else the first match on `PATH`.
///
/// # Errors
/// [`LoadError::NotFound`] naming `program`, the config `field` to set and a `hint`.
pub fn find_program(program: &str, field: &str, hint: &str) -> Result<String, LoadError> {
    let found = if program.contains('/') {
        Path::new(program).is_file().then(|| program.to_owned())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
                .map(|p| p.to_string_lossy().into_owned())
        })
    };
    found.ok_or_else(|| LoadError::NotFound {
        path: program.to_owned(),
        message: format!(
            "the executable `{program}` does not exist{}; set {field} ({hint})",
            if program.contains('/') { "" } else { " on PATH" }
        ),
    })
}
