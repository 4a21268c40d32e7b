//! `GET /metrics/node`: the machine-level gauges routers scrape, under the names the
//! Gateway API Inference Extension's endpoint picker (llm-d's) reads from a vLLM pod
//! (`docs/cluster.md`). One series per name — the picker keeps one, so per-model series
//! would collapse — and `vllm:lora_requests_info` lists the models served as its "running
//! adapters", so an unmodified picker routes each model to a node that has it loaded.
//!
//! Written by hand, not through the `/metrics` registry: a handful of lines, read in one
//! pass over the models ([`hangar_runtime::Manager::node`]), so a scrape every 50 ms costs
//! little at thousands of configured models.

use std::fmt::Write as _;

use http::{HeaderValue, StatusCode, header};

use crate::body::{Response, text_response};
use crate::error::ApiError;
use crate::health::PROMETHEUS_TEXT;
use crate::router::Ctx;

/// `GET /metrics/node`.
pub(crate) async fn node(ctx: Ctx) -> Result<Response, ApiError> {
    let view = ctx.state.manager.node();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut response = text_response(StatusCode::OK, PROMETHEUS_TEXT, render(&view, now));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// The exposition of `view`, dated `now` (Unix seconds: the value of
/// `vllm:lora_requests_info`, by which the picker takes the newest series).
pub(crate) fn render(view: &hangar_runtime::NodeView, now: f64) -> String {
    let mut out = String::with_capacity(1024);
    let gauges: [(&str, &str, String); 3] = [
        (
            "vllm:num_requests_running",
            "Requests running on every model of this node",
            view.running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "Requests waiting in the queues of every model of this node",
            view.waiting.to_string(),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "Share (0 to 1) of the loaded models' request slots in use: Hangar does not see the engines' KV blocks, so this is how full the node is by its in-flight targets",
            format!("{}", view.slots_in_use()),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n");
    }
    let _ = write!(
        out,
        "# HELP vllm:lora_requests_info The models this node serves (running_lora_adapters, aliases included) and loads (waiting_lora_adapters), and its llm slots (max_lora); the value is the time of the reading\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {now}\n",
        view.llm_slots,
        label(&view.serving),
        label(&view.loading),
    );
    out
}

/// `names`, comma-separated, as a label value.
fn label(names: &[String]) -> String {
    crate::metrics::escape(&names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_series_per_name_and_label_values_escaped() {
        let view = hangar_runtime::NodeView {
            running: 3,
            waiting: 7,
            capacity: 4,
            serving: vec!["a".into(), "pub/\"q\"".into()],
            loading: vec![],
            llm_slots: 2,
        };
        let text = render(&view, 1_700_000_000.5);
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                "vllm:num_requests_running 3",
                "vllm:num_requests_waiting 7",
                "vllm:kv_cache_usage_perc 0.75",
                "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,pub/\\\"q\\\"\",waiting_lora_adapters=\"\"} 1700000000.5",
            ]
        );
        // More running than slots (requests handed ahead to an engine) reads as full.
        let over = hangar_runtime::NodeView { running: 9, ..view };
        assert_eq!(over.slots_in_use(), 1.0);
    }
}
