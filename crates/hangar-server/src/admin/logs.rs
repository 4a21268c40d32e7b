//! `GET /v1/admin/models/{name}/logs`: the last lines of a model's engine output, or with
//! `follow=true` those lines and every later one as server-sent events.

use hangar_runtime::engine::{LOG_CAPACITY, LogLine};
use http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use crate::body::{Response, json_response, sse_response};
use crate::error::ApiError;
use crate::openai::data_event;
use crate::router::Ctx;

/// Lines answered when `tail` is absent.
const DEFAULT_TAIL: usize = 100;

/// Query of the logs route.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct LogsQuery {
    /// How many of the last lines to answer (default 100, at most the 2,000 kept).
    #[schemars(range(min = 0, max = 2000))]
    tail: Option<usize>,
    /// Keep the answer open and send each new line as a server-sent event.
    follow: Option<bool>,
}

/// The answer without `follow`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LogsResponse {
    /// The model.
    model: String,
    /// Its last lines, oldest first.
    lines: Vec<LogLineOut>,
}

/// One line of a model's log (also the `data` of each event with `follow=true`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LogLineOut {
    /// When it was read, RFC 3339 (UTC, milliseconds).
    timestamp: String,
    /// The replica whose engine wrote it.
    replica: u32,
    /// `stdout`, `stderr`, or `hangar` (the command line, exit statuses).
    stream: String,
    /// The text.
    line: String,
}

impl From<LogLine> for LogLineOut {
    fn from(l: LogLine) -> Self {
        let stream = <&str>::from(l.stream).to_owned();
        Self { timestamp: l.timestamp, replica: l.replica, stream, line: l.line }
    }
}

/// `GET /v1/admin/models/{name}/logs`.
pub(crate) async fn logs(ctx: Ctx) -> Result<Response, ApiError> {
    let query: LogsQuery = ctx.query()?;
    let tail = query.tail.unwrap_or(DEFAULT_TAIL);
    if tail > LOG_CAPACITY {
        return Err(ApiError::bad_request(format!("tail must be at most {LOG_CAPACITY}")));
    }
    let model = ctx.name().to_owned();
    let logs = ctx.state.manager.logs(&model)?;
    if !query.follow.unwrap_or(false) {
        let lines = logs.tail(tail).into_iter().map(LogLineOut::from).collect();
        return Ok(json_response(StatusCode::OK, &LogsResponse { model, lines }));
    }
    let (lines, mut live) = logs.follow(tail);
    let (response, sse) = sse_response(ctx.state.options.http.stream_write_timeout);
    let shutdown = super::events::shutting_down(ctx.state.shutdown.subscribe());
    tokio::spawn(async move {
        let follow = async {
            for line in lines {
                if sse.send(data_event(&LogLineOut::from(line))).await.is_err() {
                    return;
                }
            }
            loop {
                let event = tokio::select! {
                    next = live.recv() => match next {
                        Ok(line) => data_event(&LogLineOut::from(line)),
                        Err(RecvError::Lagged(skipped)) => {
                            data_event(&serde_json::json!({ "skipped_lines": skipped }))
                        }
                        Err(RecvError::Closed) => return,
                    },
                    () = sse.closed() => return,
                };
                if sse.send(event).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = follow => {}
            () = shutdown => {
                let _ = sse.send(super::events::shutdown_event()).await;
            }
        }
    });
    Ok(response)
}
