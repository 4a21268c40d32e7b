//! The integration tests of `hangar-eviction`, one binary for the crate (one link in CI):
//! one test per eviction rule, and properties over random loaded sets.

mod properties;
mod rules;
