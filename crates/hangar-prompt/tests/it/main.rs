//! The integration tests of `hangar-prompt`, one binary for the crate (one link in CI): every
//! format's rendered prompts against `tests/golden/`.

mod prompt_golden;
