//! Mount Hangar inside another hyper service: the host answers `/` itself and hands every
//! path under `/hangar/` to [`HangarService`], with the prefix stripped.
//!
//! `cargo run -p hangar-server --example embed_in_hyper` starts the host on a free port,
//! sends it two requests over plain TCP to show both halves answering, and exits;
//! add `-- --serve` to keep it running.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use hangar_server::{HangarService, ServerOptions};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The host's own routes, and the mount point of Hangar.
async fn host(
    hangar: HangarService,
    req: Request<Incoming>,
) -> Result<hangar_server::Response, Infallible> {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/hangar") {
        let (mut parts, body) = req.into_parts();
        let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        parts.uri = format!("{rest}{query}").parse::<Uri>().unwrap_or_default();
        return Ok(hangar.handle(Request::from_parts(parts, body)).await);
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"the host app answers here\n")).boxed()))
}

/// One HTTP/1.1 request over a raw socket; returns the status line and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok(format!("{status}\n{}", body.chars().take(200).collect::<String>()))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let config = hangar_config::Config::from_value(&serde_json::json!({
        "models": { "chat": { "backend": "stub", "enabled": true } }
    }))
    .map_err(std::io::Error::other)?;
    let backends = hangar_runtime::Backends::new().with(Arc::new(hangar_stub::StubBackend::new()));
    let manager = hangar_runtime::Manager::new(&config, backends);
    manager.load_enabled().await;
    let hangar = HangarService::new(manager, ServerOptions::from_config(&config));

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("host listening on http://{addr} (Hangar under /hangar/)");
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let hangar = hangar.clone();
            let service = hyper::service::service_fn(move |req| host(hangar.clone(), req));
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    println!("GET /\n{}\n", get(addr, "/").await?);
    println!(
        "GET /hangar/v1/admin/models/chat\n{}\n",
        get(addr, "/hangar/v1/admin/models/chat").await?
    );
    if std::env::args().any(|a| a == "--serve") {
        let _ = server.await;
    }
    Ok(())
}
