//! The integration tests of `hangar-runtime`, one binary for the crate (one link in CI): the
//! manager and its control plane on the stub engine, scenario by scenario and as random
//! interleavings. `support` holds the configs and managers they share.

mod control;
mod decisions;
mod demote;
mod failures;
mod gpu;
mod host_memory;
mod lifecycle;
mod multi_model;
mod properties;
mod reload;
mod sleep;
mod start_up;
mod support;
mod vram_properties;
