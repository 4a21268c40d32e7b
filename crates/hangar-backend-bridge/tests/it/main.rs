//! The integration tests of `hangar-backend-bridge`, one binary for the crate (one link in
//! CI): the bridge protocol against the scripted worker of `tests/worker/`, and the
//! reference worker's own Python tests.

mod protocol;
mod python_worker;
