//! The server's wire types for what the runtime reports: each mirrors a runtime type field
//! for field, derives the JSON Schema the OpenAPI document shows, and is made from the
//! runtime's with `From` (the request-side enums convert back too). The runtime's types
//! carry no schema: what goes on the wire, and how it is documented, is decided here.

mod control;
mod engine;
mod events;
mod state;
mod vram;
mod weights;

pub use control::{
    Failure, FailureKind, Lease, PauseCause, PauseInfo, PauseMode, QuarantineInfo, Residency,
    ResidencyState, SleepLevel,
};
pub use engine::{Capabilities, FinishReason, Modality, ThinkingMode};
pub use events::{EventKind, LeaseChange, ManagerCounters, ManagerEvent};
pub use state::{LifecycleEvent, ModelState};
pub use vram::{
    GgufEstimate, GpuShare, HostMemory, HostMethod, Placement, PlacementSource, ProcessTreeFigure,
    VramDetail, VramEstimateSource, VramMethod,
};
pub use weights::{
    Comparison, TensorDigest, WeightsAction, WeightsDigest, WeightsFormat, WeightsReport,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hangar_runtime::{Backends, LoadOptions, Manager};
    use serde::Serialize;
    use serde_json::{Value, json};

    use super::*;

    /// `wire` encodes exactly as the runtime value it was made from.
    fn same<R: Serialize + Clone, W: Serialize + From<R>>(runtime: &R) {
        let wire = W::from(runtime.clone());
        assert_eq!(serde_json::to_value(&wire).unwrap(), serde_json::to_value(runtime).unwrap());
    }

    #[tokio::test]
    async fn each_twin_encodes_as_the_runtime_type_it_mirrors() {
        let config = hangar_config::Config::from_value(&json!({
            "quarantine": { "failures": 1, "window_seconds": 60, "backoff_seconds": 60 },
            "models": {
                "chat": { "backend": "stub" },
                "broken": { "backend": "stub", "stub": { "fail_load": "out of memory" } },
            }
        }))
        .unwrap();
        let stub = Arc::new(hangar_stub::StubBackend::new());
        let manager = Manager::new(&config, Backends::new().with(stub));
        manager.load("chat", LoadOptions::default()).await.unwrap();
        manager.pause("chat", hangar_runtime::PauseMode::Retract).await.unwrap();
        let paused = manager.model("chat").unwrap();
        manager.resume("chat").await.unwrap();
        let lease = manager.acquire_lease("chat", "job", 60).await.unwrap();
        let leased = manager.model("chat").unwrap();
        manager.release_lease("chat", &lease.id).await.unwrap();
        manager.unload("chat").await.unwrap();
        assert!(manager.load("broken", LoadOptions::default()).await.is_err());
        let broken = manager.model("broken").unwrap();

        same::<_, PauseInfo>(&paused.pause.expect("paused"));
        same::<_, Lease>(&lease);
        same::<_, Lease>(&leased.leases[0]);
        same::<_, Capabilities>(&(*leased.capabilities).clone());
        same::<_, Failure>(&broken.failures[0]);
        same::<_, QuarantineInfo>(&broken.quarantine.expect("quarantined"));
        same::<_, ModelState>(&broken.runtime_state);
        same::<_, VramEstimateSource>(&broken.vram_estimate_source);
        same::<_, ManagerCounters>(&manager.counters());
        let events = manager.follow_events(Some((manager.events_epoch(), 0))).backlog;
        let kinds: Vec<String> = events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap()["type"].as_str().unwrap().to_owned())
            .collect();
        for kind in ["state", "paused", "resumed", "lease", "quarantined"] {
            assert!(kinds.iter().any(|k| k == kind), "no {kind} event in {kinds:?}");
        }
        for event in &events {
            same::<_, ManagerEvent>(event);
        }
        for state in [hangar_runtime::ModelState::Loaded, hangar_runtime::ModelState::Unloading] {
            assert_eq!(hangar_runtime::ModelState::from(ModelState::from(state)), state);
        }
    }

    /// The runtime value read from `sample`, then `same`: for values no stub run produces.
    fn sample<R, W>(sample: serde_json::Value)
    where
        R: Serialize + Clone + serde::de::DeserializeOwned,
        W: Serialize + From<R>,
    {
        let runtime: R = serde_json::from_value(sample.clone()).unwrap();
        assert_eq!(serde_json::to_value(&runtime).unwrap(), sample, "the sample is complete");
        same::<R, W>(&runtime);
    }

    #[test]
    fn twins_of_measurements_digests_and_request_enums_encode_alike() {
        use hangar_runtime::digest;
        use hangar_runtime::engine;
        let tree = json!({
            "mib": 5120, "replica_count": 2, "gpus": [0, 1],
            "per_gpu": [{ "gpu": 0, "mib": 3072 }, { "gpu": 1, "mib": 2048 }],
            "measured_unix_ms": 7,
        });
        let gguf = json!({
            "mib": 900, "replica_count": 1, "weights_mib": 600, "kv_cache_mib": 300,
            "n_ctx": 4096, "type_k": "f16", "type_v": "q8_0", "layers": 24,
        });
        sample::<hangar_runtime::ProcessTreeFigure, ProcessTreeFigure>(tree.clone());
        sample::<hangar_runtime::GgufEstimate, GgufEstimate>(gguf.clone());
        for (method, tree, gguf) in [
            ("process_tree", tree.clone(), gguf.clone()),
            ("gguf_estimate", Value::Null, gguf),
            ("observed_load_delta", tree, Value::Null),
            ("model_artifact_size", Value::Null, Value::Null),
        ] {
            sample::<hangar_runtime::VramDetail, VramDetail>(json!({
                "admission_mib": 5120, "admission_method": method, "replica_count": 2,
                "process_tree": tree, "gguf_estimate": gguf,
            }));
        }
        let tensor =
            json!({ "name": "w", "dtype": "F32", "shape": [2, 3], "bytes": 24, "sha256": "ab" });
        for format in ["gguf", "safetensors"] {
            sample::<digest::WeightsDigest, WeightsDigest>(json!({
                "format": format, "files": ["/m/a.gguf"], "tensors": [tensor.clone()],
                "checksum": "cd", "bytes": 24,
            }));
        }
        sample::<digest::Comparison, Comparison>(json!({
            "identical": false, "changed": ["w"], "missing": ["x"], "added": ["y"], "compared": 3,
        }));
        for reason in ["stop", "length", "tool_calls"] {
            sample::<engine::FinishReason, FinishReason>(json!(reason));
        }
        for mode in ["default", "enabled", "disabled"] {
            sample::<engine::ThinkingMode, ThinkingMode>(json!(mode));
            let wire: ThinkingMode = serde_json::from_value(json!(mode)).unwrap();
            let back = engine::ThinkingMode::from(wire);
            assert_eq!(serde_json::to_value(back).unwrap(), json!(mode));
        }
        for action in ["checksum", "snapshot", "compare", "reset_tensors"] {
            sample::<hangar_runtime::WeightsAction, WeightsAction>(json!(action));
        }
        for modality in ["text", "image"] {
            sample::<engine::Modality, Modality>(json!(modality));
        }
    }
}
