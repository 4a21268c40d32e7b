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

pub use control::{Failure, FailureKind, Lease, PauseCause, PauseInfo, PauseMode, QuarantineInfo};
pub use engine::{Capabilities, FinishReason, Modality, ThinkingMode};
pub use events::{EventKind, LeaseChange, ManagerCounters, ManagerEvent};
pub use state::{LifecycleEvent, ModelState};
pub use vram::{GgufEstimate, ProcessTreeFigure, VramDetail, VramEstimateSource, VramMethod};
pub use weights::{
    Comparison, TensorDigest, WeightsAction, WeightsDigest, WeightsFormat, WeightsReport,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hangar_runtime::{Backends, LoadOptions, Manager};
    use serde::Serialize;
    use serde_json::json;

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
}
