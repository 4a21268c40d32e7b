//! The integration tests of `hangar-weights`, one binary for the crate (one link in CI):
//! GGUF and safetensors digests, shapes, corrupt inputs and comparison. `support` builds
//! the files they read.

mod compare;
mod corrupt;
mod gguf;
mod safetensors;
mod shape;
mod support;
