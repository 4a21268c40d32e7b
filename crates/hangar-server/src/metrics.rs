//! `GET /metrics`: request counters and latency histograms, and per-model gauges read from
//! the manager at scrape time, encoded by `prometheus-client` (the OpenMetrics text format,
//! which Prometheus also reads as its plain text format).

use std::fmt::Write as _;
use std::time::Duration;

use hangar_runtime::ModelState;
use hangar_runtime::{Manager, ModelSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the request-latency histogram buckets.
const BUCKETS: [f64; 14] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// The inference endpoints, as the `endpoint` label names them.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/rerank`.
    Rerank,
    /// `POST /v1/messages` (Anthropic's Messages API).
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
}

/// A label value, escaped as the text format wants (`\`, `"` and newlines).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Label(String);

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(&escape(&self.0))
    }
}

/// `v` as a Prometheus label value: backslash, quote and newline escaped.
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    model: Label,
    outcome: Label,
}

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Request counts and latency histograms by endpoint, model and outcome, and the registry
/// that also reads every model's gauges from the manager.
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RequestLabels, Histogram, fn() -> Histogram>,
    body_bytes: Family<ListenerLabel, Counter>,
    closed: Family<ClosedLabels, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClosedLabels {
    listener: &'static str,
    reason: &'static str,
}

/// Why a listener closed a connection, as `hangar_connections_closed_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub(crate) enum CloseReason {
    /// The peer took no bytes of any answer for `http.stream_write_timeout_s`.
    Stalled,
    /// More refused calls than `connections.max_refused_calls`.
    Refused,
}

/// The counters one listener (`http`, `grpc`) adds to.
#[derive(Clone, Debug)]
pub(crate) struct ListenerCounters {
    /// Request body bytes read.
    pub(crate) body_bytes: Counter,
    /// Connections closed for stalling.
    pub(crate) stalled: Counter,
    /// Connections closed for refused calls.
    pub(crate) refused: Counter,
}

impl Metrics {
    pub(crate) fn new(manager: Manager) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register_collector(Box::new(ModelGauges(manager)));
        registry.register(
            "hangar_requests",
            "Inference requests by endpoint, model and outcome",
            requests.clone(),
        );
        registry.register(
            "hangar_request_duration_seconds",
            "Inference request latency by endpoint, model and outcome",
            durations.clone(),
        );
        let body_bytes = Family::<ListenerLabel, Counter>::default();
        registry.register(
            "hangar_request_body_bytes",
            "Request body bytes read, by listener (a call refused for its key reads none)",
            body_bytes.clone(),
        );
        let closed = Family::<ClosedLabels, Counter>::default();
        registry.register(
            "hangar_connections_closed",
            "Connections a listener closed: a peer that took no bytes (stalled) or sent too many refused calls (refused)",
            closed.clone(),
        );
        for listener in ["http", "grpc"] {
            let _ = body_bytes.get_or_create(&ListenerLabel { listener });
        }
        Self { registry, requests, durations, body_bytes, closed }
    }

    /// The counters of listener `listener` (`http` or `grpc`).
    pub(crate) fn listener(&self, listener: &'static str) -> ListenerCounters {
        let closed = |reason: CloseReason| {
            self.closed.get_or_create(&ClosedLabels { listener, reason: reason.into() }).clone()
        };
        ListenerCounters {
            body_bytes: self.body_bytes.get_or_create(&ListenerLabel { listener }).clone(),
            stalled: closed(CloseReason::Stalled),
            refused: closed(CloseReason::Refused),
        }
    }

    /// Records one finished request. `model` must be a configured name (the caller maps
    /// unknown names to a fixed label) so label cardinality stays bounded by config.
    pub(crate) fn record(&self, endpoint: Endpoint, model: &str, outcome: &str, elapsed: Duration) {
        let labels = RequestLabels {
            endpoint: endpoint.into(),
            model: Label(model.to_owned()),
            outcome: Label(outcome.to_owned()),
        };
        self.requests.get_or_create(&labels).inc();
        self.durations.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// The whole exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a collector error only truncates the text.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics encoding stopped early");
        }
        out
    }
}

/// Per-model gauges and the manager's counters, read at scrape time.
struct ModelGauges(Manager);

impl std::fmt::Debug for ModelGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelGauges")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelLabel {
    model: Label,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VramLabels {
    model: Label,
    source: &'static str,
    replicas: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuLabel {
    gpu: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelGpuLabels {
    model: Label,
    gpu: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    model: Label,
    state: &'static str,
}

type Gauge = (&'static str, &'static str, fn(&ModelSnapshot) -> u32);

const GAUGES: [Gauge; 6] = [
    (
        "hangar_model_inflight_requests",
        "Requests admitted and not finished (running + queued)",
        |m| m.inflight_requests,
    ),
    ("hangar_model_runtime_inflight", "Requests running on the model's replicas", |m| {
        m.runtime_inflight
    }),
    ("hangar_model_queue_depth", "Requests waiting in the model's queue", |m| m.queue_depth),
    ("hangar_model_loaded_replicas", "Replicas currently loaded", |m| m.loaded_replicas),
    (
        "hangar_model_quarantined",
        "1 while the model is quarantined for failing to load or crashing too often",
        |m| u32::from(m.quarantine.is_some()),
    ),
    (
        "hangar_model_asleep",
        "1 while the loaded model's runtimes sleep (a request wakes them)",
        |m| u32::from(matches!(m.residency, Some(hangar_runtime::Residency::Asleep { .. }))),
    ),
];

impl Collector for ModelGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let models = self.0.models();
        let labels: Vec<Label> = models.iter().map(|m| Label(m.name().to_owned())).collect();
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "hangar_model_state",
            "Runtime state of each configured model (1 for the current state)",
            None,
            gauge.metric_type(),
        )?;
        for (m, label) in models.iter().zip(&labels) {
            for state in ModelState::ALL {
                let labels = StateLabels { model: label.clone(), state: state.as_str() };
                let value = ConstGauge::new(i64::from(m.runtime_state == state));
                value.encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, get) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            for (m, label) in models.iter().zip(&labels) {
                let value = ConstGauge::new(i64::from(get(m)));
                value.encode(family.encode_family(&ModelLabel { model: label.clone() })?)?;
            }
        }
        // Each model's figure for `replicas` replicas and where it comes from.
        type Figure = fn(&ModelSnapshot) -> Option<(u64, &'static str, u32)>;
        let figures: [(&str, &str, Figure); 2] = [
            (
                "hangar_model_vram_estimate_bytes",
                "Each model's VRAM estimate for `replicas` replicas, and where it comes from \
                 (observed_load_delta, model_artifact_size); models without one are left out",
                |m| {
                    let source = m.vram_estimate_source.into();
                    m.vram_estimate_mib.map(|mib| (mib, source, m.vram_estimate_replica_count))
                },
            ),
            (
                "hangar_model_vram_admission_bytes",
                "What admission under vram_budget counts each GPU model as taking for \
                 `replicas` replicas, and how it was obtained (process_tree, \
                 observed_load_delta, gguf_estimate, model_artifact_size)",
                |m| {
                    let d = m.vram_detail.as_ref()?;
                    Some((d.admission_mib, d.admission_method.into(), d.replica_count))
                },
            ),
        ];
        for (name, help, figure) in figures {
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            for (m, label) in models.iter().zip(&labels) {
                let Some((mib, source, replicas)) = figure(m) else { continue };
                let labels = VramLabels { model: label.clone(), source, replicas };
                ConstGauge::new(mib_bytes(mib)).encode(family.encode_family(&labels)?)?;
            }
        }
        // Where each placed model's admission figure sits, GPU by GPU.
        let mut family = encoder.encode_descriptor(
            "hangar_model_gpu_memory_bytes",
            "What admission counts each loaded, placed model as holding on each of its GPUs \
             (its admission figure in the split measured there, else shared evenly)",
            None,
            gauge.metric_type(),
        )?;
        for (m, label) in models.iter().zip(&labels) {
            let Some(placement) = &m.placement else { continue };
            for share in &placement.holds {
                let labels = ModelGpuLabels { model: label.clone(), gpu: share.gpu.to_string() };
                ConstGauge::new(mib_bytes(share.mib)).encode(family.encode_family(&labels)?)?;
            }
        }
        encode_gpus(&self.0, &mut encoder)?;
        let c = self.0.counters();
        for (name, help, value) in [
            ("hangar_model_loads", "Loads that succeeded (reloads included)", c.loads),
            ("hangar_model_load_failures", "Loads that failed", c.load_failures),
            ("hangar_model_unloads", "Unloads completed, evictions included", c.unloads),
            ("hangar_model_evictions", "Models unloaded to make room for another", c.evictions),
            ("hangar_runtime_crashes", "Runtimes that crashed while loaded", c.crashes),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// MiB as bytes, for a gauge.
fn mib_bytes(mib: u64) -> i64 {
    i64::try_from(mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX)
}

/// `hangar_gpu_telemetry_available` and, per GPU, its used and total memory in bytes.
fn encode_gpus(
    manager: &Manager,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let gpus = manager.gpu_readings();
    let available = ConstGauge::new(i64::from(gpus.is_ok()));
    available.encode(encoder.encode_descriptor(
        "hangar_gpu_telemetry_available",
        "1 when GPU memory can be read (NVML), 0 otherwise (the reason is in /v1/admin/gpu-memory)",
        None,
        available.metric_type(),
    )?)?;
    let gpus = gpus.unwrap_or_default();
    type Field = fn(&hangar_runtime::GpuReading) -> u64;
    let fields: [(&str, &str, Field); 2] = [
        ("hangar_gpu_memory_used_bytes", "GPU memory in use", |g| g.used_mib),
        ("hangar_gpu_memory_total_bytes", "GPU memory in all", |g| g.total_mib),
    ];
    for (name, help, mib) in fields {
        let mut family = encoder.encode_descriptor(name, help, None, available.metric_type())?;
        for gpu in &gpus {
            let labels = GpuLabel { gpu: gpu.index.to_string() };
            ConstGauge::new(mib_bytes(mib(gpu))).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
