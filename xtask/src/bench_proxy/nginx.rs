//! nginx as the reference reverse proxy of `cargo xtask bench proxy`: installed with apt when
//! missing (as root), run in the foreground on a generated config, on its defaults and tuned.

use super::*;

/// How nginx is set up as the reference proxy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum NginxSetup {
    /// As a user gets it: Debian's `worker_processes auto` and a bare `proxy_pass`.
    Defaults,
    /// Tuned for proxying an LLM server: upstream keep-alive, no buffering, one worker.
    Tuned,
}

impl NginxSetup {
    pub(super) fn dir(self) -> &'static str {
        match self {
            Self::Defaults => "nginx-defaults",
            Self::Tuned => "nginx-tuned",
        }
    }
}

/// nginx in the foreground on a generated config. Stopped (SIGTERM, then SIGKILL) on drop.
pub(super) struct Nginx {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(super) base: String,
    setup: NginxSetup,
}

impl Nginx {
    /// nginx on [`nginx_conf`] in `<work>/nginx-<setup>`, proxying to `upstream`
    /// (`host:port`).
    pub(super) fn start(
        binary: &Path,
        work: &Path,
        upstream: &str,
        setup: NginxSetup,
    ) -> Result<Self> {
        let dir = &work.join(setup.dir());
        std::fs::create_dir_all(dir.join("temp"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir, upstream, port, is_root(), setup))
            .with_context(|| format!("cannot write {}", conf.display()))?;
        let log = dir.join("nginx.out");
        let out = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        Ok(Self { child, base: format!("http://127.0.0.1:{port}"), setup })
    }

    pub(super) fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(format!("{status}; see target/bench/proxy/{}/error.log", self.setup.dir()))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker too (SIGKILL would leave the worker behind).
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx config: logs, pid and temp files under `dir`, loopback `port`, no access log.
/// [`NginxSetup::Defaults`]: Debian's `worker_processes auto` and `location / { proxy_pass
/// http://upstream; }`, nothing else. [`NginxSetup::Tuned`]: one worker, an upstream block
/// with a pool of keep-alive connections, HTTP/1.1 to it and no buffering (server-sent
/// events pass as they come). As root, the workers run as nobody.
pub(super) fn nginx_conf(
    dir: &Path,
    upstream: &str,
    port: u16,
    root: bool,
    setup: NginxSetup,
) -> String {
    let d = dir.display();
    let user = if root { "user nobody nogroup;\n" } else { "" };
    let (workers, pool, proxy) = match setup {
        NginxSetup::Defaults => ("auto", String::new(), format!("proxy_pass http://{upstream};")),
        NginxSetup::Tuned => (
            "1",
            format!(
                "upstream llama {{\n        server {upstream};\n        keepalive 32;\n    }}\n    "
            ),
            "proxy_pass http://llama;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 300s;"
                .to_owned(),
        ),
    };
    format!(
        "{user}worker_processes {workers};
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
    client_body_temp_path {d}/temp/client_body;
    proxy_temp_path {d}/temp/proxy;
    fastcgi_temp_path {d}/temp/fastcgi;
    uwsgi_temp_path {d}/temp/uwsgi;
    scgi_temp_path {d}/temp/scgi;
    {pool}server {{
        listen 127.0.0.1:{port};
        location / {{
            {proxy}
        }}
    }}
}}
"
    )
}

/// nginx on `PATH` (or Debian's `/usr/sbin/nginx`); installed with apt when missing and
/// running as root.
pub(super) fn ensure_nginx() -> Result<PathBuf> {
    if let Some(found) = find_nginx() {
        return Ok(found);
    }
    if !is_root() {
        bail!(
            "nginx is not installed: install the Debian package `{NGINX_PACKAGE}` (e.g. `sudo \
             apt-get install -y {NGINX_PACKAGE}`), or run as root, which installs it"
        );
    }
    eprintln!("nginx: not found, installing the Debian package `{NGINX_PACKAGE}`");
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "--no-install-recommends", NGINX_PACKAGE])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::io::stderr());
        run_checked(cmd)
    };
    if install().is_err() {
        let mut update = Command::new("apt-get");
        update.arg("update").stdout(std::io::stderr());
        run_checked(update)?;
        install()?;
    }
    find_nginx().with_context(|| format!("no nginx after installing `{NGINX_PACKAGE}`"))
}

pub(super) fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

pub(super) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
