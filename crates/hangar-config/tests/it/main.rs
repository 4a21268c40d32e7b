//! The integration tests of `hangar-config`, one binary for the crate (one link in CI): the
//! `definition` projection, the shipped fixtures, where a model may run (`gpus`, `gpu_split`), load override validation and the spec's
//! `load_constraints` / `load_recommendations` payloads.

mod definition;
mod fixtures;
mod overrides;
mod placement;
mod spec_payloads;
