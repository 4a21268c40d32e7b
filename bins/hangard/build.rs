//! With `llama-cpp-shared`, `hangard` looks for llama.cpp's libraries in `$ORIGIN/lib` first
//! (`DT_RPATH`, searched before `LD_LIBRARY_PATH`), then on `LD_LIBRARY_PATH`. The GPU check
//! carries `llama-cpp-sys-2`'s `libllama-common` there (its C++ API is the one `hangard` was
//! built against) and finds the C libraries, built with CUDA on the device, on
//! `LD_LIBRARY_PATH`; engine children inherit only the latter, so their own `libllama-common`
//! is not shadowed. `docs/gpu-check.md` says why.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_LLAMA_CPP_SHARED").is_some() {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,$ORIGIN/lib");
        println!("cargo:rustc-link-arg-bins=-Wl,--disable-new-dtags");
    }
}
