//! The load every path of `cargo xtask bench proxy` gets: one way to the upstream
//! (`Target`), sequential chat completions and the throughput blocks, over one HTTP client
//! configuration.

use super::*;

/// The key of Hangar's `llama-server` child in the bench: configured, so the paths that
/// reach the child without Hangar send it too (every path pays the same check).
pub(super) const UPSTREAM_KEY: &str = "hangar-bench-upstream-key";

/// One way to the upstream `llama-server`.
pub(super) struct Target {
    /// `direct`, `hangar`, `nginx (defaults)` or `nginx (tuned)`.
    pub(super) name: &'static str,
    /// `http://127.0.0.1:PORT/v1/chat/completions`.
    pub(super) chat_url: String,
    /// The bearer key sent: the child's, on the paths that reach it without Hangar.
    pub(super) key: Option<&'static str>,
}

impl Target {
    /// One non-streamed chat completion; its wall time (request sent → body read).
    pub(super) fn chat(&self, agent: &ureq::Agent, body: &str) -> Result<Duration> {
        let started = Instant::now();
        let mut request = agent.post(&self.chat_url).content_type("application/json");
        if let Some(key) = self.key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response =
            request.send(body).with_context(|| format!("{}: chat completion", self.name))?;
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("{}: chat completion body", self.name))?;
        let took = started.elapsed();
        let status = response.status();
        if status != 200 || !text.contains("\"choices\"") {
            bail!("{}: chat completion answered {status}: {text}", self.name);
        }
        Ok(took)
    }
}

/// [`CLIENTS`] threads, each with its own agent (one keep-alive connection) and one warm-up
/// request, sending requests back to back for [`THROUGHPUT_BLOCK`]; the latency of every
/// completed request and the wall time from the common start to the last thread's end.
pub(super) fn throughput(target: &Target, body: &str) -> Result<(Vec<Duration>, Duration)> {
    let barrier = Barrier::new(CLIENTS + 1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| -> Result<(Vec<Duration>, Instant)> {
                    let agent = client();
                    let warm = target.chat(&agent, body);
                    barrier.wait();
                    warm?;
                    let deadline = Instant::now() + THROUGHPUT_BLOCK;
                    let mut latencies = Vec::new();
                    while Instant::now() < deadline {
                        latencies.push(target.chat(&agent, body)?);
                    }
                    Ok((latencies, Instant::now()))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut all = Vec::new();
        let mut end = start;
        for thread in threads {
            let (latencies, done) =
                thread.join().map_err(|_| anyhow::anyhow!("a client panicked"))??;
            all.extend(latencies);
            end = end.max(done);
        }
        Ok((all, end - start))
    })
}

/// The chat request of every path: greedy, [`MAX_TOKENS`] tokens, not streamed.
pub(super) fn chat_body() -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    })
    .to_string()
}

/// The HTTP client of the whole bench: keep-alive connections (idle ones reused for up to
/// [`IDLE_AGE`]), error statuses are answers, no redirects.
pub(super) fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(64)
        .max_idle_connections_per_host(CLIENTS)
        .max_idle_age(IDLE_AGE)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .build()
        .new_agent()
}
