//! `GET /v1/admin/events`: the manager's event journal as server-sent events, from now on,
//! or — with `Last-Event-ID` — from after the last event a client saw.

use std::time::Duration;

use bytes::Bytes;
use hangar_runtime::{Follow, Manager};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use crate::body::{Response, SseSender, sse_response};
use crate::error::ApiError;
use crate::openai::data_event;
use crate::router::Ctx;

/// A comment line goes out after this long without an event, so proxies and clients see a
/// live connection.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Query of the events route.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct EventsQuery {
    /// Resume after this event id (`<epoch>-<n>`, as sent); the `Last-Event-ID` header does
    /// the same and this parameter wins over it.
    #[schemars(regex(pattern = r"^[0-9]{1,19}-[0-9]{1,19}$"))]
    last_event_id: Option<String>,
}

/// The `data` of each event: a journaled change, or a notice.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum EventOut {
    /// A change, with its id.
    Event(crate::wire::ManagerEvent),
    /// Events the client asked for are gone, or the server is shutting down.
    Notice(Notice),
}

/// An event without an id: `resync`, sent first when events after the client's
/// `Last-Event-ID` are no longer kept (it is too far behind, or the server restarted);
/// `shutdown`, sent last when the server shuts down and ends the stream.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Notice {
    /// `resync` or `shutdown`.
    #[serde(rename = "type")]
    kind: NoticeKind,
    /// What happened and what to do.
    message: String,
}

/// What a [`Notice`] says.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NoticeKind {
    /// Re-read `GET /v1/admin/models`: events were lost.
    Resync,
    /// The server is shutting down; the stream ends after this event.
    Shutdown,
}

/// The `shutdown` notice that ends event and log streams.
pub(crate) fn shutdown_event() -> Bytes {
    let message = "hangard is shutting down: this stream ends; reconnect when it is back";
    data_event(&Notice { kind: NoticeKind::Shutdown, message: message.to_owned() })
}

/// Resolves once the service shuts down (at once when it already does).
pub(crate) async fn shutting_down(mut shutdown: tokio::sync::watch::Receiver<bool>) {
    // An error means the service is gone: shut down too.
    let _ = shutdown.wait_for(|down| *down).await;
}

/// `GET /v1/admin/events`.
pub(crate) async fn events(ctx: Ctx) -> Result<Response, ApiError> {
    let query: EventsQuery = ctx.query()?;
    // The query wins; a header that is not text is a bad id, not an absent one.
    let header = ctx.headers.get("last-event-id").map(|v| String::from_utf8_lossy(v.as_bytes()));
    let after = query.last_event_id.as_deref().or(header.as_deref()).map(parse_id).transpose()?;
    let manager = ctx.state.manager.clone();
    let follow = manager.follow_events(after);
    let (response, sse) = sse_response(ctx.state.options.http.stream_write_timeout);
    let shutdown = shutting_down(ctx.state.shutdown.subscribe());
    tokio::spawn(async move {
        tokio::select! {
            () = pump(manager, follow, &sse) => {}
            () = shutdown => {
                let _ = sse.send(shutdown_event()).await;
            }
        }
    });
    Ok(response)
}

/// `<epoch>-<n>` → `(epoch, n)`, each a decimal `u64` of ASCII digits; anything else
/// (empty, signed, over `u64::MAX`, other characters) is 400 `invalid_request`. A
/// well-formed id this server never sent is the journal's to judge: a resync.
fn parse_id(id: &str) -> Result<(u64, u64), ApiError> {
    let number = |s: &str| {
        // `u64::from_str` would take a leading `+`.
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    id.trim().split_once('-').and_then(|(epoch, n)| Some((number(epoch)?, number(n)?))).ok_or_else(
        || {
            // The id is the client's: quote a bounded, printable part of it.
            let shown: String = id.chars().take(64).flat_map(char::escape_debug).collect();
            ApiError::bad_request(format!(
                "Last-Event-ID `{shown}` is not an event id of this server (`<epoch>-<n>`)"
            ))
        },
    )
}

/// Sends the backlog, then the live feed, until the client goes away. A follower that
/// falls behind the live feed picks up again from the journal.
async fn pump(manager: Manager, mut follow: Follow, sse: &SseSender) {
    let epoch = manager.events_epoch();
    // The id of the last event sent (or skipped as already known).
    let mut cursor = follow.backlog.first().map_or(follow.last_id, |e| e.id - 1);
    loop {
        if follow.gap {
            let message = "events after the given Last-Event-ID are no longer kept: re-read \
                           GET /v1/admin/models";
            let resync = Notice { kind: NoticeKind::Resync, message: message.to_owned() };
            if sse.send(data_event(&EventOut::Notice(resync))).await.is_err() {
                return;
            }
        }
        for event in std::mem::take(&mut follow.backlog) {
            if !send(sse, epoch, &mut cursor, event).await {
                return;
            }
        }
        loop {
            tokio::select! {
                next = follow.live.recv() => match next {
                    Ok(event) => {
                        if !send(sse, epoch, &mut cursor, event).await {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                },
                () = sse.closed() => return,
                () = tokio::time::sleep(KEEP_ALIVE) => {
                    if sse.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                }
            }
        }
        // Fell behind the live feed: what was missed is still in the journal (or a resync
        // says it is not).
        follow = manager.follow_events(Some((epoch, cursor)));
    }
}

/// Sends `event` with its id unless the cursor is already past it; false once the client
/// is gone.
async fn send(
    sse: &SseSender,
    epoch: u64,
    cursor: &mut u64,
    event: hangar_runtime::ManagerEvent,
) -> bool {
    if event.id <= *cursor {
        return true;
    }
    *cursor = event.id;
    let id = event.id;
    let json =
        serde_json::to_string(&EventOut::Event(event.into())).unwrap_or_else(|_| "{}".to_owned());
    sse.send(Bytes::from(format!("id: {epoch}-{id}\ndata: {json}\n\n"))).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_last_event_id_parses_or_is_a_400_never_a_panic() {
        let max = u64::MAX;
        let cases: &[(&str, Option<(u64, u64)>)] = &[
            ("1700000000000-42", Some((1_700_000_000_000, 42))),
            ("  7-0 ", Some((7, 0))),
            ("18446744073709551615-18446744073709551615", Some((max, max))),
            ("18446744073709551616-1", None),
            ("1-18446744073709551616", None),
            ("99999999999999999999999999999999-1", None),
            ("", None),
            ("-", None),
            ("7-", None),
            ("-7", None),
            ("-1-5", None),
            ("7--5", None),
            ("+7-5", None),
            ("7-+5", None),
            ("7-5-3", None),
            ("7_5", None),
            ("٣-٤", None),
            ("７-５", None),
            ("7-5\u{0}", None),
            ("\u{fffd}\u{fffd}", None),
            ("yesterday", None),
        ];
        for &(id, expected) in cases {
            match (parse_id(id), expected) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{id:?}"),
                (Err(e), None) => {
                    assert_eq!(e.code.as_str(), "invalid_request", "{id:?}");
                    assert!(e.message.len() < 400, "{id:?}: {}", e.message);
                }
                (got, want) => panic!("{id:?}: got {got:?}, want {want:?}"),
            }
        }
        let long = "9".repeat(100_000);
        assert!(parse_id(&long).unwrap_err().message.len() < 400);
    }
}
