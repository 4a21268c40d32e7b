//! What every test binary of this crate shares: llama.cpp initialised once per process, with
//! its log lines routed into `tracing` as the composition root (`hangard`) does, so that a
//! failed load carries llama.cpp's own reason.

use std::sync::{Arc, OnceLock};

use hangar_backend_llamacpp::llama_cpp_2::{self, LogOptions, llama_backend::LlamaBackend};

/// The process's llama.cpp backend, with the log hook installed.
pub(crate) fn llama() -> Arc<LlamaBackend> {
    static LLAMA: OnceLock<Arc<LlamaBackend>> = OnceLock::new();
    Arc::clone(LLAMA.get_or_init(|| {
        llama_cpp_2::send_logs_to_tracing(LogOptions::default());
        Arc::new(LlamaBackend::init().expect("llama.cpp initialises once per process"))
    }))
}
