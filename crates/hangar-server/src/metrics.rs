//! `GET /metrics`: Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use hangar_lifecycle::ModelState;
use hangar_runtime::Manager;

/// Upper bounds (seconds) of the request-latency histogram buckets.
const BUCKETS: [f64; 14] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

#[derive(Default)]
struct Histogram {
    count: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

/// Request counts and latency histograms by endpoint, model and outcome.
#[derive(Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, String, String), Histogram>>,
}

impl Metrics {
    /// Records one finished request. `model` must be a configured name (the caller maps
    /// unknown names to a fixed label) so label cardinality stays bounded by config.
    pub(crate) fn record(
        &self,
        endpoint: &'static str,
        model: &str,
        outcome: &str,
        elapsed: Duration,
    ) {
        let secs = elapsed.as_secs_f64();
        let mut map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let h = map.entry((endpoint, model.to_owned(), outcome.to_owned())).or_default();
        h.count += 1;
        h.sum += secs;
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                h.buckets[i] += 1;
            }
        }
    }

    /// The whole exposition: model gauges from the manager, counters, histograms.
    pub(crate) fn render(&self, manager: &Manager) -> String {
        let mut out = String::new();
        let models = manager.models();
        out.push_str("# HELP hangar_model_state Runtime state of each configured model (1 for the current state).\n");
        out.push_str("# TYPE hangar_model_state gauge\n");
        for m in &models {
            for state in ModelState::ALL {
                let v = u8::from(m.runtime_state == state);
                let _ = writeln!(
                    out,
                    "hangar_model_state{{model=\"{}\",state=\"{state}\"}} {v}",
                    esc(&m.name)
                );
            }
        }
        type Gauge = (&'static str, &'static str, fn(&hangar_runtime::ModelSnapshot) -> u32);
        let gauges: [Gauge; 4] = [
            (
                "hangar_model_inflight_requests",
                "Requests admitted and not finished (running + queued).",
                |m| m.inflight_requests,
            ),
            ("hangar_model_runtime_inflight", "Requests running on the model's replicas.", |m| {
                m.runtime_inflight
            }),
            ("hangar_model_queue_depth", "Requests waiting in the model's queue.", |m| {
                m.queue_depth
            }),
            ("hangar_model_loaded_replicas", "Replicas currently loaded.", |m| m.loaded_replicas),
        ];
        for (name, help, get) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for m in &models {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", esc(&m.name), get(m));
            }
        }
        let c = manager.counters();
        for (name, help, value) in [
            ("hangar_model_loads_total", "Loads that succeeded.", c.loads),
            ("hangar_model_load_failures_total", "Loads that ended in failed.", c.load_failures),
            ("hangar_model_unloads_total", "Unloads completed, evictions included.", c.unloads),
            (
                "hangar_model_evictions_total",
                "Models unloaded to make room for another.",
                c.evictions,
            ),
            ("hangar_runtime_crashes_total", "Runtimes that crashed while loaded.", c.crashes),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str(
            "# HELP hangar_requests_total Inference requests by endpoint, model and outcome.\n",
        );
        out.push_str("# TYPE hangar_requests_total counter\n");
        for ((endpoint, model, outcome), h) in map.iter() {
            let _ = writeln!(
                out,
                "hangar_requests_total{{endpoint=\"{endpoint}\",model=\"{}\",outcome=\"{outcome}\"}} {}",
                esc(model),
                h.count
            );
        }
        out.push_str("# HELP hangar_request_duration_seconds Inference request latency by endpoint, model and outcome.\n");
        out.push_str("# TYPE hangar_request_duration_seconds histogram\n");
        for ((endpoint, model, outcome), h) in map.iter() {
            let labels =
                format!("endpoint=\"{endpoint}\",model=\"{}\",outcome=\"{outcome}\"", esc(model));
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "hangar_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {}",
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "hangar_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "hangar_request_duration_seconds_sum{{{labels}}} {}", h.sum);
            let _ = writeln!(out, "hangar_request_duration_seconds_count{{{labels}}} {}", h.count);
        }
        out
    }
}

/// Escapes a label value.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.record("chat_completions", "chat", "ok", Duration::from_millis(30));
        m.record("chat_completions", "chat", "ok", Duration::from_millis(3));
        let map = m.requests.lock().unwrap();
        let h = &map[&("chat_completions", "chat".to_owned(), "ok".to_owned())];
        assert_eq!(h.count, 2);
        assert_eq!(h.buckets[0], 1, "le=0.005 holds the 3 ms request");
        assert_eq!(h.buckets[3], 2, "le=0.05 holds both");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
