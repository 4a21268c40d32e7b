//! The integration tests of `hangard`, one binary for the crate (llama.cpp and the server
//! are linked once): the real `hangard serve` on an OS-assigned loopback port, driven over
//! HTTP, with its engines (llama.cpp in process, `llama-server` and `vllm` children, the
//! Python bridge) on the committed fixtures and the trained models. `support` starts and
//! stops the server and speaks HTTP and server-sent events to it.

mod anthropic;
mod bridge;
mod children;
mod cli_flags;
mod config_cli;
mod config_reload;
mod edge;
mod flood;
mod gpu;
mod gpu_places;
mod llama_control;
mod llama_http;
mod llama_server;
mod llama_sleep;
mod local_agent;
mod prompt_cache;
mod remote_tls;
mod repository_folders;
mod serve;
mod soak;
mod start_up;
mod support;
mod trained;
mod vllm_sleep;
