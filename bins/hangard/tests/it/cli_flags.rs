//! `hangard serve`'s model-wide flags (`--ctx-size`, `--llamacpp-args`, `--llamacpp`) and
//! `hangard logs`, as users run them: the real binary, and a fake `llama-server` (a shell
//! script that prints its arguments and exits) so no engine is needed.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Server, get, hangard, load, temp_dir};

/// The variables these flags read, removed so the host cannot leak into a test.
const FLAG_ENV: [&str; 3] = ["HANGAR_CTX_SIZE", "HANGAR_LLAMACPP_ARGS", "HANGAR_LLAMACPP"];

/// A directory holding `fake-llama-server` and a model file for it, removed on drop.
struct Fake(PathBuf);

impl Fake {
    fn new() -> Self {
        let dir = temp_dir("fake-llama-server");
        let script = dir.join("fake-llama-server");
        std::fs::write(
            &script,
            "#!/bin/sh\necho \"args: $*\"\necho 'fake llama-server: no GPU here' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A real GGUF: Hangar checks the file before it starts the engine.
        std::fs::copy(crate::support::engines::fixture("tiny-llama.gguf"), dir.join("model.gguf"))
            .unwrap();
        Self(dir)
    }

    fn binary(&self) -> String {
        self.0.join("fake-llama-server").to_str().unwrap().to_owned()
    }

    /// A model file: loads check that `model_path` is a GGUF.
    fn model(&self) -> String {
        self.0.join("model.gguf").to_str().unwrap().to_owned()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two `llama_server` models (only `server` names the `fake` build), a `llama_cpp` model and
/// a stub. Nothing loads at start.
fn settings(fake: &Fake) -> Value {
    json!({ "models": {
        "server": {
            "backend": "llama_server", "model_path": fake.model(), "load_timeout_s": 30,
            "llama_server_n_ctx": 2048, "llama_server_extra_args": ["--from-config"],
            "llama_server_binary_path": "/nonexistent/llama-server",
            "llama_server_backends": { "fake": fake.binary(), "vulkan": "/opt/vulkan/llama-server" }
        },
        "server-cpu": {
            "backend": "llama_server", "model_path": "/m/b.gguf",
            "llama_server_binary_path": "/opt/cpu/llama-server"
        },
        "gguf": { "backend": "llama_cpp", "model_path": "/m/c.gguf", "gguf_n_ctx": 4096 },
        "chat": { "backend": "stub" }
    }})
}

/// Every model's definition from `GET /v1/admin/models`, by name.
async fn definitions(server: &Server) -> Value {
    let (status, body) = get(server, "/v1/admin/models").await;
    assert_eq!(status, 200, "{body}");
    let rows = body["models"].as_array().unwrap();
    rows.iter().map(|m| (m["name"].as_str().unwrap().to_owned(), m["definition"].clone())).collect()
}

/// `hangard ARGS` (a client command against `server`), waited for.
fn client(server: &Server, args: &[&str]) -> Output {
    let mut cmd = hangard();
    cmd.args(args).args(["--url", &server.base]);
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `hangard serve` on `dir` with `args` and `env`, expecting it to refuse to start:
/// returns its stderr. Fails if it is still running after 30 s.
fn refused(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = hangard();
    for var in FLAG_ENV {
        cmd.env_remove(var);
    }
    cmd.args(["serve", "--port", "0", "--config"]).arg(dir).args(args).envs(env.iter().copied());
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("hangard serve {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{args:?}: {}", out.status);
    text(&out.stderr)
}

#[tokio::test]
async fn serve_flags_and_their_env_vars_patch_every_model_they_concern() {
    let fake = Fake::new();
    let server = Server::start_with(
        &settings(&fake),
        &["--ctx-size", "8192", "--llamacpp", "fake"],
        &[("HANGAR_LLAMACPP_ARGS", "--jinja -fa on")],
    );
    let defs = definitions(&server).await;
    let server_def = &defs["server"];
    assert_eq!(server_def["llama_server_n_ctx"], 8192, "{server_def}");
    assert_eq!(server_def["llama_server_extra_args"], json!(["--jinja", "-fa", "on"]));
    assert_eq!(server_def["llama_server_binary_path"], fake.binary());
    let cpu = &defs["server-cpu"];
    assert_eq!(cpu["llama_server_n_ctx"], 8192, "{cpu}");
    assert_eq!(cpu["llama_server_extra_args"], json!(["--jinja", "-fa", "on"]));
    assert_eq!(cpu["llama_server_binary_path"], "/opt/cpu/llama-server", "no `fake` build");
    assert_eq!(defs["gguf"]["gguf_n_ctx"], 8192, "{}", defs["gguf"]);
    assert!(defs["gguf"].get("llama_server_binary_path").is_none(), "{}", defs["gguf"]);
    assert_eq!(defs["chat"]["backend"], "stub");
    let logs = server.logs();
    assert!(
        logs.lines().any(|l| l.contains("keep their binary") && l.contains("server-cpu")),
        "a warning names the models without the build:\n{logs}"
    );

    // The spawned engine got them: the fake binary with the patched command line.
    let (status, answer) = load(&server, "server", json!({})).await;
    assert_ne!(status, 200, "the fake engine exits: {answer}");
    let out = client(&server, &["logs", "server"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let printed = text(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert!(lines.len() >= 4, "started, stdout, stderr, exit:\n{printed}");
    for line in &lines {
        let (timestamp, rest) = line.split_once(' ').unwrap();
        assert!(timestamp.len() == 24 && timestamp.ends_with('Z'), "{line}");
        assert!(rest.starts_with("[0] "), "{line}");
    }
    let args = lines.iter().find(|l| l.contains(" stdout: args: ")).expect(&printed);
    for part in [&format!("-m {}", fake.model()), "-c 8192", "--jinja -fa on"] {
        assert!(args.contains(part), "{part}: {args}");
    }
    assert!(!args.contains("--from-config"), "--llamacpp-args replaces: {args}");
    assert!(lines.iter().any(|l| l.ends_with(" stderr: fake llama-server: no GPU here")));
    assert!(lines[0].contains(" hangar: started pid ") && lines[0].contains(&fake.binary()));

    let tail = client(&server, &["logs", "server", "--tail", "1"]);
    assert_eq!(text(&tail.stdout), format!("{}\n", lines[lines.len() - 1]));

    // `--follow` prints the same lines, then waits for more (until killed).
    let mut follow = hangard();
    follow.args(["logs", "-f", "server", "--url", &server.base]).stdout(Stdio::piped());
    let mut follow = follow.spawn().unwrap();
    let stdout = follow.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    for expected in &lines {
        let got = rx.recv_timeout(Duration::from_secs(20)).expect("a followed line");
        assert_eq!(&got, expected);
    }
    assert!(follow.try_wait().unwrap().is_none(), "--follow keeps the stream open");
    follow.kill().unwrap();
    follow.wait().unwrap();
}

#[tokio::test]
async fn logs_of_an_unknown_model_fail_like_the_other_client_commands() {
    let fake = Fake::new();
    let server = Server::start(&settings(&fake), &[]);
    for args in [&["logs", "nope"][..], &["logs", "-f", "nope"], &["unload", "nope"]] {
        let out = client(&server, args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("error: ") && stderr.contains("(404 Not Found)"), "{stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = client(&server, &["logs", "chat"]);
    assert!(out.status.success() && out.stdout.is_empty(), "a stub model has no engine output");
}

#[test]
fn managed_llamacpp_args_refuse_to_start_in_either_form() {
    let fake = Fake::new();
    let dir = temp_dir("flags");
    std::fs::write(dir.join("settings.json"), settings(&fake).to_string()).unwrap();
    for args in ["--port 9000", "--jinja --host=0.0.0.0", "-m /x.gguf", "--model=/x.gguf"] {
        let stderr = refused(&dir, &["--llamacpp-args", args], &[]);
        assert!(stderr.contains("--llamacpp-args: `-"), "{args}: {stderr}");
        assert!(stderr.contains("is managed by Hangar"), "{args}: {stderr}");
    }
    let stderr = refused(&dir, &[], &[("HANGAR_LLAMACPP_ARGS", "--port=1")]);
    assert!(stderr.contains("`--port` is managed by Hangar"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_llamacpp_build_refuses_to_start_naming_the_known_ones() {
    let fake = Fake::new();
    let dir = temp_dir("flags");
    std::fs::write(dir.join("settings.json"), settings(&fake).to_string()).unwrap();
    let stderr = refused(&dir, &["--llamacpp", "cuda"], &[]);
    assert!(stderr.contains("`cuda`") && stderr.contains("(known: fake, vulkan)"), "{stderr}");
    let stderr = refused(&dir, &[], &[("HANGAR_LLAMACPP", "rocm")]);
    assert!(stderr.contains("`rocm`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn keys_come_from_files_and_a_key_on_the_command_line_is_warned_of() {
    use reqwest::Method;

    use crate::support::{code, send};
    let dir = temp_dir("key-files");
    let (admin, inference) = (dir.join("admin.key"), dir.join("inference.keys"));
    std::fs::write(&admin, "from-file\n").unwrap();
    std::fs::write(&inference, "# one a line\ni1\n\ni2\n").unwrap();
    let config = json!({ "models": { "chat": { "backend": "stub" } } });
    let args = [
        "--admin-api-key-file",
        admin.to_str().unwrap(),
        "--inference-api-key-file",
        inference.to_str().unwrap(),
    ];
    let server = Server::start(&config, &args);
    let models = server.url("/v1/admin/models");
    assert_eq!(send(Method::GET, &models, None, None).await.0, 401);
    assert_eq!(send(Method::GET, &models, None, Some("from-file")).await.0, 200);
    let chats = server.url("/v1/models");
    for key in ["i1", "i2"] {
        assert_eq!(send(Method::GET, &chats, None, Some(key)).await.0, 200, "{key}");
    }
    let (status, answer) = send(Method::GET, &chats, None, Some("# one a line")).await;
    assert_eq!((status, code(&answer)), (403, "forbidden"), "comments are not keys");
    assert!(!server.logs().contains("puts a key on the command line"), "{}", server.logs());
    drop(server);

    let server = Server::start(&config, &["--admin-api-key", "on-the-line"]);
    assert_eq!(send(Method::GET, &models_of(&server), None, Some("on-the-line")).await.0, 200);
    let logs = server.logs();
    assert!(logs.contains("--admin-api-key puts a key on the command line"), "{logs}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn models_of(server: &Server) -> String {
    server.url("/v1/admin/models")
}
