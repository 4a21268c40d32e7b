//! The integration tests of `hangar-backend-llamacpp`, one binary for the crate (llama.cpp
//! is linked once): the engine, continuous batching, constrained decoding and memory on the
//! committed tiny GGUF fixtures. `support` initialises llama.cpp once for the process.

mod batching;
mod engine;
mod memory;
mod saved;
mod sleep;
mod structured;
mod support;
