//! [`BridgeRuntime`]: one loaded replica in its worker process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use hangar_backend::{
    Capabilities, CrashSink, EmbedRequest, Embeddings, FinishReason, GenerateEvent,
    GenerateRequest, GenerateSummary, Prompt, RerankRequest, Rerankings, Runtime, RuntimeDetails,
    RuntimeError, SleepLevel,
};
use hangar_config::PromptFormat;
use hangar_prompt::{self as prompt, RenderRequest};
use hangar_supervisor::{Child, Spawner};
use tokio::sync::{mpsc, watch};

use crate::protocol::{GenerateOp, Message, Op, Params, Reply};
use crate::session::Session;
use crate::worker::PrivateDir;

/// How long a request that saw the worker die waits for the watcher's full account (exit
/// status and last output) before it reports what it knows.
const OBITUARY_WAIT: Duration = Duration::from_secs(2);

/// What a loaded replica is made of.
pub(crate) struct Parts {
    pub(crate) session: Arc<Session>,
    pub(crate) child: Arc<Child>,
    pub(crate) capabilities: Capabilities,
    pub(crate) details: RuntimeDetails,
    pub(crate) prompt_format: PromptFormat,
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) grace: Duration,
    pub(crate) crash: CrashSink,
    /// Kept alive with the runtime: the spawner thread (its end kills the child) and the
    /// directory of the worker's files.
    pub(crate) _keep: (Arc<Spawner>, Arc<PrivateDir>),
}

/// A loaded replica: requests go to its worker over the session.
pub(crate) struct BridgeRuntime {
    parts: Parts,
    obituary: watch::Receiver<Option<String>>,
}

impl BridgeRuntime {
    /// The runtime, with its watcher: when the session dies or the process exits while not
    /// unloading, the process group is killed and the crash is reported with the reason,
    /// the exit status and the worker's last output.
    pub(crate) fn start(parts: Parts) -> Arc<dyn Runtime> {
        let (tell, obituary) = watch::channel(None);
        let (session, child) = (Arc::clone(&parts.session), Arc::clone(&parts.child));
        let (stopping, crash) = (Arc::clone(&parts.stopping), parts.crash.clone());
        tokio::spawn(async move {
            let reason = tokio::select! {
                why = session.died() => {
                    // A worker that died closes its socket first: give its exit a moment.
                    let status = match child.wait_for(Duration::from_secs(1)).await {
                        Some(status) => status,
                        None => {
                            child.stop(Duration::ZERO).await;
                            child.wait().await
                        }
                    };
                    format!("bridge worker: {why}; {}", child.obituary(&status))
                }
                status = child.wait() => {
                    session.die(format!("the worker process {status}"));
                    format!("bridge worker: {}", child.obituary(&status))
                }
            };
            let _ = tell.send(Some(reason.clone()));
            if !stopping.load(Ordering::SeqCst) {
                crash.report(reason);
            }
        });
        Arc::new(Self { parts, obituary })
    }

    /// The crash error for a request that saw the worker die (`seen`).
    async fn crashed(&self, seen: String) -> RuntimeError {
        let mut obituary = self.obituary.clone();
        let reason =
            match tokio::time::timeout(OBITUARY_WAIT, obituary.wait_for(Option::is_some)).await {
                Ok(Ok(full)) => full.clone().unwrap_or(seen),
                _ => format!("bridge worker: {seen}"),
            };
        RuntimeError::Crashed { reason }
    }

    /// A reply that does not belong to the request: the worker is broken.
    async fn violation(&self, op: &str, reply: &Reply) -> RuntimeError {
        let why = format!("the worker answered {op} with {reply:?}");
        self.parts.session.die(why.clone());
        self.crashed(why).await
    }

    /// A worker's error reply as a request error; `protocol` (the worker could not read what
    /// Hangar sent) means the two sides disagree, which is a crash.
    async fn error(&self, op: &str, code: &str, message: String) -> RuntimeError {
        if code == "protocol" {
            let why = format!("the worker refused {op} as a protocol error: {message}");
            self.parts.session.die(why.clone());
            return self.crashed(why).await;
        }
        request_error(code, message)
    }

    /// Sends `op` and waits for its final reply; an error reply or the worker's death is
    /// the request's error.
    async fn request(&self, op: &Op) -> Result<Reply, RuntimeError> {
        match self.parts.session.call(op).finish().await {
            Ok(Reply::Error { code, message, .. }) => {
                Err(self.error(op.name(), &code, message).await)
            }
            Ok(reply) => Ok(reply),
            Err(seen) => Err(self.crashed(seen).await),
        }
    }

    /// Sends `op`, whose answer is `ok`.
    async fn done(&self, op: &Op) -> Result<(), RuntimeError> {
        match self.request(op).await? {
            Reply::Ok => Ok(()),
            other => Err(self.violation(op.name(), &other).await),
        }
    }

    /// The prompt as the worker takes it: rendered text, or the messages for `auto`.
    fn prompt(&self, request: &GenerateRequest) -> Result<GenerateOp, RuntimeError> {
        if request.tools.is_some() || request.format.is_some() {
            return Err(RuntimeError::Unsupported {
                message:
                    "tool calls and structured outputs are not supported by Python-bridge engines"
                        .into(),
            });
        }
        let render = RenderRequest {
            prompt: &request.prompt,
            thinking: request.thinking,
            translation: request.translation.as_ref(),
        };
        let rendered = prompt::render(self.parts.prompt_format, &render)
            .map_err(|e| RuntimeError::InvalidRequest { message: e.to_string() })?;
        let messages = match (&rendered, &request.prompt) {
            (None, Prompt::Chat(messages)) => Some(
                messages
                    .iter()
                    .map(|m| Message { role: m.role.as_str(), content: m.content.clone() })
                    .collect(),
            ),
            _ => None,
        };
        let p = &request.params;
        Ok(GenerateOp {
            prompt: rendered,
            messages,
            thinking: request.thinking.as_str(),
            params: Params {
                max_tokens: p.max_tokens,
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                seed: p.seed,
                stop: p.stop.clone(),
            },
        })
    }
}

impl Drop for BridgeRuntime {
    /// A runtime dropped without `unload` (a load that failed on another replica) does not
    /// leave its worker behind: the session ends and the watcher stops the process, quietly.
    fn drop(&mut self) {
        self.parts.stopping.store(true, Ordering::SeqCst);
        self.parts.session.die("the runtime was dropped".into());
    }
}

/// A worker's error reply as a request error.
fn request_error(code: &str, message: String) -> RuntimeError {
    match code {
        "cancelled" => RuntimeError::Cancelled,
        "invalid_request" => RuntimeError::InvalidRequest { message },
        "unsupported" => RuntimeError::Unsupported { message },
        _ => RuntimeError::Failed { message: format!("{code}: {message}") },
    }
}

#[async_trait]
impl Runtime for BridgeRuntime {
    fn capabilities(&self) -> &Capabilities {
        &self.parts.capabilities
    }

    fn details(&self) -> RuntimeDetails {
        self.parts.details.clone()
    }

    fn pid(&self) -> Option<u32> {
        u32::try_from(self.parts.child.pid()).ok()
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        let op = Op::Generate(self.prompt(&request)?);
        let mut call = self.parts.session.call(&op);
        // Once the client is gone the worker is asked to stop, and the slot is given back
        // only when it has (its final reply).
        let mut cancelled = false;
        loop {
            let reply = tokio::select! {
                biased;
                reply = call.next() => reply,
                () = events.closed(), if !cancelled => {
                    call.cancel();
                    cancelled = true;
                    continue;
                }
            };
            match reply {
                Ok(Reply::Token { text }) => {
                    if !cancelled && events.send(GenerateEvent::Text(text)).await.is_err() {
                        call.cancel();
                        cancelled = true;
                    }
                }
                Ok(Reply::Done { .. }) if cancelled => return Err(RuntimeError::Cancelled),
                Ok(Reply::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                    stop_sequence,
                }) => {
                    let finish_reason = match finish_reason.as_str() {
                        "length" => FinishReason::Length,
                        _ => FinishReason::Stop,
                    };
                    return Ok(GenerateSummary {
                        finish_reason,
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens: 0,
                        stop_sequence,
                    });
                }
                Ok(Reply::Error { code, message, .. }) => {
                    return Err(self.error("generate", &code, message).await);
                }
                Ok(other) => return Err(self.violation("generate", &other).await),
                Err(seen) => return Err(self.crashed(seen).await),
            }
        }
    }

    /// The worker's `count`: the engine's own template and tokenizer, nothing generated.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u32, RuntimeError> {
        let op = Op::Count(self.prompt(&request)?);
        match self.request(&op).await? {
            Reply::Counted { prompt_tokens } => Ok(prompt_tokens),
            other => Err(self.violation("count", &other).await),
        }
    }

    async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        let op = Op::Embed { inputs: request.inputs };
        match self.request(&op).await? {
            Reply::Embeddings { vectors, prompt_tokens } => {
                Ok(Embeddings { vectors, prompt_tokens })
            }
            other => Err(self.violation("embed", &other).await),
        }
    }

    async fn rerank(&self, request: RerankRequest) -> Result<Rerankings, RuntimeError> {
        let op = Op::Rerank { query: request.query, documents: request.documents };
        match self.request(&op).await? {
            Reply::Rerankings { scores, prompt_tokens } => Ok(Rerankings { scores, prompt_tokens }),
            other => Err(self.violation("rerank", &other).await),
        }
    }

    /// `sleep` at vLLM's level 1 ([`SleepLevel::WeightsToHost`]) or 2
    /// ([`SleepLevel::WeightsDiscarded`]); the worker answers `unsupported` for a model that
    /// cannot sleep.
    async fn sleep(&self, level: SleepLevel) -> Result<(), RuntimeError> {
        let level = match level {
            SleepLevel::WeightsToHost => 1,
            SleepLevel::WeightsDiscarded => 2,
            SleepLevel::Context => {
                return Err(RuntimeError::Unsupported {
                    message: "a bridge engine sleeps at weights_to_host (vLLM level 1) or \
                              weights_discarded (level 2), not at context"
                        .into(),
                });
            }
        };
        self.done(&Op::Sleep { level }).await
    }

    /// `wake` (the worker reloads the weights after level 2).
    async fn wake(&self) -> Result<(), RuntimeError> {
        self.done(&Op::Wake).await
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        match self.parts.session.reason() {
            Some(seen) => Err(self.crashed(seen).await),
            None => Ok(()),
        }
    }

    /// `unload`, then `shutdown`, each bounded by the grace period; a worker that has not
    /// exited by then is stopped (SIGTERM, then SIGKILL).
    async fn unload(&self) {
        let Parts { session, child, stopping, grace, .. } = &self.parts;
        stopping.store(true, Ordering::SeqCst);
        for op in [Op::Unload, Op::Shutdown] {
            let mut call = session.call(&op);
            if tokio::time::timeout(*grace, call.finish()).await.is_err() {
                break;
            }
        }
        if child.wait_for(*grace).await.is_none() {
            child.stop(*grace).await;
        }
        session.die("unloaded".into());
    }
}
