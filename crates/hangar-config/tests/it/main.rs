//! The integration tests of `hangar-config`, one binary for the crate (one link in CI): the
//! `definition` projection and the shipped fixtures.

mod definition;
mod fixtures;
