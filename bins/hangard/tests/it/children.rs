//! Engine children with least privilege, as `hangard serve` starts them: the real
//! `llama-server` on the tiny GGUF fixture and the fake `vllm serve`, watched through
//! `/proc`. Their environment is an allow-list (no `HANGAR_*`, no secret), each has a key
//! only Hangar knows (a request straight to the child is refused, the same through Hangar
//! served), Lemonade's `llamacpp_args` pass an allow-list of flags, and forwarded bodies
//! keep Hangar's rules.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::engines::{fake_vllm, fixture, llama_server_binary};
use crate::support::{Server, post, send};

const ADMIN: &str = "admin-key-for-children";
const INFERENCE: &str = "inference-key-for-children";

fn llama_model() -> Value {
    json!({
        "backend": "llama_server",
        "model_path": fixture("tiny-llama.gguf"),
        "llama_server_binary_path": llama_server_binary(),
        "llama_server_n_ctx": 1024,
        "llama_server_extra_args": ["--no-webui"],
    })
}

fn vllm_model() -> Value {
    json!({
        "backend": "vllm_serve",
        "vllm_binary_path": fake_vllm(),
        "vllm_model": "Qwen/Qwen3-0.6B",
        "vllm_env": { "VLLM_CONFIGURED": "from-config" },
    })
}

fn enabled(mut model: Value) -> Value {
    model["enabled"] = json!(true);
    model
}

/// Waits until `model` is loaded (its start-up load, with the admin key).
async fn until_loaded(server: &Server, model: &str) {
    let url = server.url(&format!("/v1/admin/models/{model}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, row) = send(Method::GET, &url, None, Some(ADMIN)).await;
        if row["runtime_state"] == "loaded" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{model} never loaded: {row}\n{}",
            server.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A child's environment, by name.
fn environ(pid: u64) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|&b| b == 0)
        .filter_map(|var| {
            String::from_utf8_lossy(var).split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Where a child listens: a loopback port, or a Unix socket.
enum Reach {
    Port(u16),
    Socket(std::path::PathBuf),
}

/// `(pid, where it listens)` of the model's one child, from its admin row.
async fn child_of(server: &Server, model: &str) -> (u64, Reach) {
    let url = server.url(&format!("/v1/admin/models/{model}"));
    let (status, row) = send(Method::GET, &url, None, Some(ADMIN)).await;
    assert_eq!(status, 200, "{row}");
    let details = &row["runtime_details"][0];
    let pid = details["pid"].as_u64().unwrap_or_else(|| panic!("{row}"));
    if let Some(socket) = details["socket"].as_str() {
        return (pid, Reach::Socket(socket.into()));
    }
    let url = details["backend_url"].as_str().unwrap_or_else(|| panic!("{row}"));
    let port = url.rsplit(':').next().unwrap().trim_end_matches("/v1").parse().unwrap();
    (pid, Reach::Port(port))
}

/// The status of a chat `POST` straight to a child, without a key.
fn direct_chat(reach: &Reach, model: &str) -> u16 {
    match reach {
        Reach::Port(port) => ask_directly(TcpStream::connect(("127.0.0.1", *port)).unwrap(), model),
        Reach::Socket(path) => {
            ask_directly(std::os::unix::net::UnixStream::connect(path).unwrap(), model)
        }
    }
}

fn ask_directly(mut stream: impl Read + Write, model: &str) -> u16 {
    let body = json!({ "model": model, "max_tokens": 2, "messages": [{ "role": "user", "content": "hi" }] }).to_string();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

async fn chat(server: &Server, body: Value) -> (u16, Value) {
    send(Method::POST, &server.url("/v1/chat/completions"), Some(&body), Some(INFERENCE)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn children_get_an_allow_listed_environment_and_a_key_only_hangar_knows() {
    let settings = json!({
        "max_loaded_models": { "llm": 2 },
        "children": { "pass_env": ["FAKE_VLLM_*"], "secret_env": ["HF_TOKEN"] },
        "models": { "chat": enabled(llama_model()), "fake": enabled(vllm_model()) },
    });
    let env = [
        ("HANGAR_ADMIN_KEY", ADMIN),
        ("HANGAR_INFERENCE_KEYS", INFERENCE),
        ("HANGAR_SOMETHING_ELSE", "hangar-only"),
        ("AWS_SECRET_ACCESS_KEY", "not-for-engines"),
        ("HF_TOKEN", "hf-secret"),
        ("HF_HOME", "/tmp/hf-home"),
        ("FAKE_VLLM_TOKEN_DELAY_MS", "0"),
    ];
    let server = Server::start_with(&settings, &[], &env);
    for model in ["chat", "fake"] {
        until_loaded(&server, model).await;
    }
    for (model, key_var) in [("chat", "LLAMA_API_KEY"), ("fake", "VLLM_API_KEY")] {
        let (pid, reach) = child_of(&server, model).await;
        let vars = environ(pid);
        let hangar: Vec<&String> = vars.keys().filter(|k| k.starts_with("HANGAR_")).collect();
        assert!(hangar.is_empty(), "{model}: {hangar:?}");
        for secret in [ADMIN, INFERENCE, "hangar-only", "not-for-engines", "hf-secret"] {
            assert!(!vars.values().any(|v| v.contains(secret)), "{model} got {secret}");
        }
        assert!(vars.contains_key("PATH"), "{model}: {vars:?}");
        assert_eq!(vars.get("HF_HOME").map(String::as_str), Some("/tmp/hf-home"), "{model}");
        let key = vars.get(key_var).unwrap_or_else(|| panic!("{model}: no {key_var}"));
        assert_eq!(key.len(), 64, "{model}");
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
                .into_owned();
        assert!(!cmdline.contains(key.as_str()), "{model}: the key is on the command line");
        // Straight to the child: refused. Through Hangar: served.
        assert_eq!(direct_chat(&reach, model), 401, "{model}");
        // vLLM's key guards only `/v1`: its child listens on no port, on a socket in a
        // directory only Hangar's user can enter.
        if let Reach::Socket(socket) = &reach {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(model, "fake");
            let dir = std::fs::metadata(socket.parent().unwrap()).unwrap();
            assert_eq!(dir.permissions().mode() & 0o777, 0o700);
            assert!(!cmdline.contains("--port"), "{cmdline}");
        } else {
            assert_eq!(
                model, "chat",
                "only llama-server, whose key guards all but its health and model list, has a port"
            );
        }
        let body = json!({ "model": model, "max_tokens": 2, "messages": [{ "role": "user", "content": "hi" }] });
        let (status, answer) = chat(&server, body).await;
        assert_eq!(status, 200, "{model}: {answer}");
    }
    let (pid, _) = child_of(&server, "fake").await;
    let vars = environ(pid);
    // The model's own variables, and those `children.pass_env` adds.
    assert_eq!(vars.get("VLLM_CONFIGURED").map(String::as_str), Some("from-config"));
    assert_eq!(vars.get("FAKE_VLLM_TOKEN_DELAY_MS").map(String::as_str), Some("0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn lemonade_load_passes_allowed_llama_server_flags_and_names_each_refused_one() {
    let settings = json!({ "models": { "chat": llama_model() } });
    let server = Server::start(&settings, &[]);
    let refused = [
        ("--log-file /tmp/hangar-child-log", "--log-file"),
        ("-hf org/model", "-hf"),
        ("--lora /tmp/adapter.gguf", "--lora"),
        ("--path /", "--path"),
        ("--slot-save-path /tmp", "--slot-save-path"),
        ("--api-key mine", "--api-key"),
        ("--port 9000", "--port"),
        ("--host 0.0.0.0", "--host"),
        ("-m /other.gguf", "-m"),
        ("--chat-template-file /etc/passwd", "--chat-template-file"),
        ("--threads /etc/passwd", "/etc/passwd"),
    ];
    for (args, named) in refused {
        let body = json!({ "model_name": "chat", "llamacpp_args": args });
        let (status, answer) = post(&server, "/api/v1/load", body).await;
        assert_eq!(status, 400, "{args}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("`{named}`")), "{args}: {message}");
    }
    assert!(!std::path::Path::new("/tmp/hangar-child-log").exists());
    let (_, row) = send(Method::GET, &server.url("/v1/admin/models/chat"), None, None).await;
    assert_eq!(row["runtime_state"], "unloaded", "nothing was started: {row}");
    // Allowed flags reach the child's command line.
    let args = "--threads 2 --batch-size 64 --flash-attn off --temp 0.5";
    let body = json!({ "model_name": "chat", "llamacpp_args": args });
    let (status, answer) = post(&server, "/api/v1/load", body).await;
    assert_eq!(status, 200, "{answer}");
    let (_, row) = send(Method::GET, &server.url("/v1/admin/models/chat"), None, None).await;
    let pid = row["runtime_details"][0]["pid"].as_u64().unwrap_or_else(|| panic!("{row}"));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> =
        cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let joined = argv.join(" ");
    assert!(joined.contains(args), "{joined}");
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_requests_keep_hangars_rules() {
    let settings = json!({ "models": { "chat": enabled(llama_model()) } });
    let server = Server::start_with(
        &settings,
        &[],
        &[("HANGAR_ADMIN_KEY", ADMIN), ("HANGAR_INFERENCE_KEYS", INFERENCE)],
    );
    until_loaded(&server, "chat").await;
    let hi = json!([{ "role": "user", "content": "hi" }]);
    let image = |url: &str| {
        json!([{ "role": "user", "content": [
            { "type": "text", "text": "what is it?" },
            { "type": "image_url", "image_url": { "url": url } }
        ] }])
    };
    let cases = [
        (json!({ "messages": hi, "n": 4 }), "n"),
        (json!({ "messages": hi, "best_of": 2 }), "best_of"),
        (
            json!({ "messages": image("http://169.254.169.254/latest/meta-data/") }),
            "messages[0].content[1].image_url.url",
        ),
        (
            json!({ "messages": image("file:///etc/passwd") }),
            "messages[0].content[1].image_url.url",
        ),
        (json!({ "messages": hi, "id_slot": 0 }), "id_slot"),
        (json!({ "messages": hi, "chat_template": "{{ 'pwned' }}" }), "chat_template"),
    ];
    for (mut body, field) in cases {
        body["model"] = json!("chat");
        body["max_tokens"] = json!(2);
        let (status, answer) = chat(&server, body.clone()).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}: {answer}"
        );
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    // The same request within the rules is served.
    let (status, answer) =
        chat(&server, json!({ "model": "chat", "max_tokens": 2, "n": 1, "messages": hi })).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_answer_over_the_bound_is_a_typed_error() {
    let settings = json!({
        "limits": { "max_answer_bytes": 128 },
        "children": { "pass_env": ["FAKE_VLLM_*"] },
        "models": { "fake": enabled(vllm_model()) },
    });
    let env = [
        ("HANGAR_ADMIN_KEY", ADMIN),
        ("HANGAR_INFERENCE_KEYS", INFERENCE),
        ("FAKE_VLLM_TOKEN_DELAY_MS", "0"),
    ];
    let server = Server::start_with(&settings, &[], &env);
    until_loaded(&server, "fake").await;
    let body = json!({ "model": "fake", "max_tokens": 8, "messages": [{ "role": "user", "content": "hi" }] });
    let (status, answer) = chat(&server, body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (502, Some("upstream_answer_too_large")),
        "{answer}"
    );
    assert!(answer["error"]["message"].as_str().unwrap().contains("128 bytes"), "{answer}");
}

/// Issue 59: a weight update of a `vllm_serve` model started from a hub id (`vllm_model`)
/// reported the new weights and kept serving the old ones: the new child now loads the
/// path the update names.
#[tokio::test(flavor = "multi_thread")]
async fn a_vllm_weight_update_serves_the_weights_it_names() {
    let dir = crate::support::temp_dir("vllm-update");
    let weights = dir.join("step-1");
    std::fs::create_dir_all(&weights).unwrap();
    std::fs::File::create(weights.join("model.safetensors")).unwrap().set_len(1 << 20).unwrap();
    let model = json!({ "backend": "vllm_serve", "vllm_binary_path": fake_vllm(), "vllm_model": "org/base" });
    let server = Server::start(&json!({ "models": { "fake": model } }), &[]);
    let command =
        |row: &Value| row["runtime_details"][0]["command"].as_str().unwrap_or("").to_owned();
    let (status, row) = post(&server, "/v1/admin/models/fake/load", json!({})).await;
    assert_eq!(status, 200, "{row}");
    assert!(command(&row).contains("serve org/base"), "{row}");
    let update = json!({ "model_path": weights, "weight_version": "step-1" });
    let path = "/v1/admin/models/fake/update-weights-from-disk";
    let (status, answer) = post(&server, path, update).await;
    assert_eq!(status, 200, "{answer}");
    let (_, row) = crate::support::get(&server, "/v1/admin/models/fake").await;
    assert_eq!(row["weight_version"], "step-1", "{row}");
    let served = command(&row);
    assert!(served.contains(&format!("serve {}", weights.display())), "{served}");
    assert!(!served.contains("org/base"), "{served}");
    let _ = std::fs::remove_dir_all(&dir);
}
