//! The integration tests of `hangar-backend-process`, one binary for the crate (one link in
//! CI): command lines, supervision, least-privilege children and answer limits, against the
//! fake `vllm serve` of `tests/fake-vllm/`.

mod aliases;
mod answers;
mod children;
mod launch;
mod sleep;
mod supervise;
mod support;
