//! `GET /v1/admin/models`: the model list, encoded page by page.
//!
//! A list of 10,000 models is about 10 MB of JSON. Encoded in one buffer, with every
//! snapshot taken first, each list held twice that at its peak, and the allocator kept the
//! peak as resident memory. A list of more than one page is instead a stream of chunks,
//! each a page of rows encoded from a page of snapshots when the connection can take it.
//! A list is not one atomic picture either way: each row is read under its own model's
//! lock.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hangar_runtime::ModelFilter;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};

use crate::body::Response;
use crate::state::AppState;

/// Rows a chunk holds: about 128 KiB of JSON for stub models.
pub(crate) const PAGE: usize = 128;

const OPEN: &[u8] = b"{\"models\":[";
const CLOSE: &[u8] = b"]}";

/// The list of the models `filter` passes: one body when it fits in a page, else a stream
/// of pages.
pub(crate) fn response(state: Arc<AppState>, filter: ModelFilter) -> Response {
    let mut list = Pages { state, filter, next: Some(0), first: true };
    let first = list.chunk();
    let body = match list.next {
        None => Full::new(first).boxed(),
        Some(_) => FirstThen { first: Some(first), rest: list }.boxed(),
    };
    let mut response = http::Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The pages still to encode.
struct Pages {
    state: Arc<AppState>,
    filter: ModelFilter,
    /// The config position to continue from; `None` once the list is closed.
    next: Option<usize>,
    /// Whether no row was written yet.
    first: bool,
}

impl Pages {
    /// The next chunk: the opening on the first, a page of rows, the closing on the last.
    fn chunk(&mut self) -> Bytes {
        let Some(from) = self.next else { return Bytes::new() };
        let (snapshots, next) = self.state.manager.list_page(&self.filter, from, PAGE);
        let mut out = Vec::with_capacity(snapshots.len() * 1536 + OPEN.len() + CLOSE.len());
        if from == 0 {
            out.extend_from_slice(OPEN);
        }
        self.state.rows.write_rows(&mut out, &snapshots, self.first);
        self.first &= snapshots.is_empty();
        if next.is_none() {
            out.extend_from_slice(CLOSE);
        }
        self.next = next;
        out.into()
    }
}

/// A chunk already encoded, then the rest page by page.
struct FirstThen {
    first: Option<Bytes>,
    rest: Pages,
}

impl Body for FirstThen {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if this.rest.next.is_none() {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(Frame::data(this.rest.chunk()))))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.next.is_none()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use serde_json::{Value, json};

    use super::PAGE;

    /// `n` stub models, every third an embedding model, `model-00001` loaded.
    async fn service(n: usize) -> crate::HangarService {
        let models: serde_json::Map<String, Value> = (0..n)
            .map(|i| {
                let labels = if i % 3 == 0 { json!(["embedding"]) } else { json!([]) };
                (format!("model-{i:05}"), json!({ "backend": "stub", "labels": labels }))
            })
            .collect();
        let config = hangar_config::Config::from_value(&json!({ "models": models })).unwrap();
        let stub = std::sync::Arc::new(hangar_stub::StubBackend::new());
        let manager =
            hangar_runtime::Manager::new(&config, hangar_runtime::Backends::new().with(stub));
        if n > 1 {
            manager.load("model-00001", hangar_runtime::LoadOptions::default()).await.unwrap();
        }
        crate::HangarService::new(manager, crate::ServerOptions::default())
    }

    /// The list's chunks and the whole body.
    async fn list(s: &crate::HangarService, query: &str) -> (usize, Value) {
        let request = http::Request::get(format!("/v1/admin/models{query}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = s.handle(request).await;
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let (mut chunks, mut bytes) = (0, Vec::new());
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                chunks += 1;
                bytes.extend_from_slice(&data);
            }
        }
        (chunks, serde_json::from_slice(&bytes).expect("the whole list is one JSON document"))
    }

    fn names(list: &Value) -> Vec<String> {
        list["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().into())
            .collect()
    }

    #[tokio::test]
    async fn a_list_longer_than_a_page_streams_page_by_page_and_reads_as_one_document() {
        let n = PAGE * 2 + 7;
        let s = service(n).await;
        let (chunks, all) = list(&s, "").await;
        assert_eq!(chunks, 3, "one chunk a page");
        let want: Vec<String> = (0..n).map(|i| format!("model-{i:05}")).collect();
        assert_eq!(names(&all), want, "every model once, in config order");
        // Each streamed row is the row the single-model route answers.
        let one = s.manager().model("model-00001").unwrap();
        let row = serde_json::to_value(s.state.rows.row(&one)).unwrap();
        assert_eq!(all["models"][1], row);
        assert_eq!(row["runtime_state"], "loaded");

        // A filter that passes rows scattered over every page.
        let (_, embedding) = list(&s, "?type=embedding").await;
        let want: Vec<String> = (0..n).step_by(3).map(|i| format!("model-{i:05}")).collect();
        assert_eq!(names(&embedding), want);
        // One that passes a single row, and one that passes none.
        let (_, loaded) = list(&s, "?state=loaded").await;
        assert_eq!(names(&loaded), ["model-00001"]);
        let (_, failed) = list(&s, "?state=failed").await;
        assert_eq!(failed, json!({ "models": [] }));
    }

    #[tokio::test]
    async fn a_list_of_one_page_or_none_is_one_chunk() {
        for n in [0, 1, PAGE] {
            let (chunks, all) = list(&service(n).await, "").await;
            assert_eq!((chunks, names(&all).len()), (1, n), "{n} models");
        }
    }
}
