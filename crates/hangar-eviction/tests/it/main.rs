//! The integration tests of `hangar-eviction`, one binary for the crate (one link in CI):
//! one test per eviction rule, properties over random loaded sets, and per-GPU placement.

mod placement;
mod properties;
mod rules;
