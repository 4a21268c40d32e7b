//! The integration tests of `hangar-backend`, one binary for the crate (one link in CI):
//! load override validation, the rendered prompts against `tests/golden/`, the spec's
//! payloads and the stub backend. A module per concern.

mod overrides;
mod prompt_golden;
mod spec_payloads;
mod stub;
