//! `openai_remote` over `https://`: the real `hangard` forwards to a TLS server (the fake
//! `vllm serve` of `hangar-backend-process`'s tests with its TLS switch) whose certificate is
//! signed by a test CA generated here. Hangar trusts the system's roots, replaced by
//! `SSL_CERT_FILE` when that is set: with the test CA there the model loads and chats, with
//! the system's roots the load fails on the certificate — verification is never skipped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};

use crate::support::{Server, load, post, temp_dir};

/// A test CA and a server certificate for `127.0.0.1` signed by it, as PEM files in `dir`:
/// (`ca.pem`, `cert.pem`, `key.pem`).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "Hangar test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert =
        CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// The fake `vllm serve` on HTTPS, killed on drop.
struct TlsRemote {
    child: Child,
    base: String,
}

impl TlsRemote {
    fn start(cert: &Path, key: &Path) -> Self {
        let fake = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../crates/hangar-backend-process/tests/fake-vllm/vllm");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new("python3")
            .arg(fake)
            .args(["serve", "remote-model", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--api-key", "tls-key"])
            .env("FAKE_VLLM_TLS_CERT", cert)
            .env("FAKE_VLLM_TLS_KEY", key)
            .env("FAKE_VLLM_TOKEN_DELAY_MS", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 starts the fake vllm");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = stderr.lines().map_while(Result::ok);
        let listening = lines.by_ref().find(|l| l.contains("Uvicorn running on"));
        let listening = listening.expect("the fake vllm says it listens");
        assert!(listening.contains("https://"), "{listening}");
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, base: format!("https://127.0.0.1:{port}/v1") }
    }
}

impl Drop for TlsRemote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn settings(base: &str) -> Value {
    json!({
        "models": {
            "secure": {
                "backend": "openai_remote",
                "openai_base_url": base,
                "openai_model": "remote-model",
                "openai_api_key_env": "TLS_REMOTE_KEY",
            },
        },
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_remote_over_https_verifies_the_certificate_against_ssl_cert_file() {
    let dir = temp_dir("tls");
    let (ca, cert, key) = certificates(&dir);
    let remote = TlsRemote::start(&cert, &key);
    let ca = ca.to_str().unwrap();

    let trusted = Server::start_with(
        &settings(&remote.base),
        &[],
        &[("SSL_CERT_FILE", ca), ("TLS_REMOTE_KEY", "tls-key")],
    );
    let (status, row) = load(&trusted, "secure", json!({})).await;
    assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
    let chat = json!({
        "model": "secure",
        "messages": [{ "role": "user", "content": "hello over TLS" }],
        "max_tokens": 3,
    });
    let (status, body) = post(&trusted, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "word0 word1 word2", "{body}");

    // The system's roots (the test CA not among them): the handshake fails and says why.
    let untrusted = Server::start_with(
        &settings(&remote.base),
        &[],
        &[("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"), ("TLS_REMOTE_KEY", "tls-key")],
    );
    let (status, body) = load(&untrusted, "secure", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("load_failed")), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("unreachable") && message.contains("certificate"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
