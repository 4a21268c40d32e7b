//! The `grpc` target: see `hangar_fuzz::TARGETS`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hangar_fuzz::run("grpc", data));
