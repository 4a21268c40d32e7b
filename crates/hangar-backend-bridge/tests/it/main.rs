//! The integration tests of `hangar-backend-bridge`, one binary for the crate (one link in
//! CI): the bridge protocol against the scripted worker of `tests/worker/`, the reference
//! worker's own Python tests, and vLLM's sleep mode through the reference worker.

mod protocol;
mod python_worker;
mod vllm_sleep;
