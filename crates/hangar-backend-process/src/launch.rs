//! [`Launch`]: how one replica's engine process is started — program, argv, environment,
//! address — built from the effective model definition (config with the load's overrides).

use std::path::Path;

use hangar_backend::LoadError;
use hangar_config::{
    BackendSettings, LlamaServerSettings, ModelConfig, ModelType, SpecType, Switch,
    VllmServeSettings, VllmSettings,
};
use serde_json::{Map, Value, json};

use hangar_supervisor::LOOPBACK;
pub use hangar_supervisor::{Launch, find_program};

/// `llama-server` for `model`, listening on `port` (a configured port is used as the first
/// replica's, the next replicas take the ports after it).
///
/// # Errors
/// [`LoadError::NotFound`] when the binary or a model file does not exist;
/// [`LoadError::Refused`] for a model of another backend.
pub fn llama_server(
    model: &ModelConfig,
    replica: u32,
    free_port: u16,
) -> Result<Launch, LoadError> {
    let BackendSettings::LlamaServer(s) = &model.settings else {
        return Err(wrong_backend(model));
    };
    let LlamaServerSettings { llama_server_host: host, llama_server_port: port, .. } = s;
    let program = find_program(
        s.llama_server_binary_path.as_deref().unwrap_or("llama-server"),
        "llama_server_binary_path",
        "in a Hangar checkout, `cargo xtask llama-server` builds one",
    )?;
    let path = model.model_path.as_deref().ok_or_else(|| LoadError::Refused {
        message: format!("model '{}' has no model_path", model.name),
    })?;
    for (field, file) in [
        ("model_path", Some(path)),
        ("llama_server_mmproj", s.llama_server_mmproj.as_deref()),
        ("llama_server_draft_model", s.llama_server_draft_model.as_deref()),
    ] {
        if let Some(file) = file {
            exists(file, field)?;
        }
    }
    let host = host.clone().unwrap_or_else(|| LOOPBACK.to_owned());
    let port = port.map_or(free_port, |p| p.saturating_add(replica as u16));
    // llama.cpp's parser knows no `--flag=value`; it takes the element after a flag as the
    // value, whatever it starts with, so no value here can become a flag of its own.
    let mut args = Args::default();
    args.push2("-m", path);
    args.push2("--host", &host);
    args.push2("--port", port);
    args.push2("--alias", model.name.as_str());
    args.opt("-c", s.llama_server_n_ctx);
    args.push2("--parallel", model.target_inflight);
    if model.target_inflight.get() > 1 {
        // llama-server shares one KV cache between its slots only when it picks the slot
        // count itself; with an explicit count each slot would get n_ctx / slots.
        args.0.push("--kv-unified".to_owned());
    }
    args.opt("--mmproj", s.llama_server_mmproj.as_deref());
    args.opt("--model-draft", s.llama_server_draft_model.as_deref());
    match s.llama_server_n_gpu_layers {
        Some(-1) => args.push2("--n-gpu-layers", "all"),
        layers => args.opt("--n-gpu-layers", layers),
    }
    args.opt("--flash-attn", s.llama_server_flash_attn.map(switch));
    args.opt("--reasoning", s.llama_server_reasoning.map(switch));
    args.opt("--image-max-tokens", s.llama_server_image_max_tokens);
    args.opt("--spec-type", s.llama_server_spec_type.map(|SpecType::DraftMtp| "draft-mtp"));
    args.opt("--spec-draft-n-max", s.llama_server_spec_draft_n_max);
    args.opt("--spec-draft-p-min", s.llama_server_spec_draft_p_min);
    match model.model_type {
        ModelType::Embedding => args.0.push("--embedding".to_owned()),
        ModelType::Reranking => args.0.push("--reranking".to_owned()),
        ModelType::Llm => {}
    }
    let extra = s.llama_server_extra_args.as_deref().unwrap_or_default();
    if model.gpu_split.get() > 1 && !has_flag(extra, &["--tensor-split", "-ts"]) {
        // An even share on each of its GPUs, as admission counted it.
        let shares = vec!["1"; model.gpu_split.get() as usize].join(",");
        args.push2("--tensor-split", shares);
    }
    args.0.extend(extra.iter().cloned());
    let api_key = child_key(s.llama_server_api_key.as_ref())?;
    let env = vec![("LLAMA_API_KEY".to_owned(), api_key.clone())];
    Ok(Launch {
        program,
        args: args.0,
        env,
        pass_env: model.pass_env.clone(),
        library_path: s.llama_server_library_path.clone(),
        host,
        port,
        socket: None,
        api_key: Some(api_key),
    })
}

/// `vllm serve` for `model`, listening on `socket`, a Unix socket in a directory only
/// Hangar's user can enter, unless the model names a `vllm_host` or `vllm_port` (then there,
/// as [`llama_server`]). vLLM's `--api-key` guards its `/v1` routes alone — `/tokenize`,
/// `/pooling`, `/v2/rerank` and `/metrics` answer anyone who reaches the port — and its
/// sleep routes (`vllm_enable_sleep_mode`) exist only in its development mode and take no
/// key: on the socket, every route is the child's and Hangar's alone.
///
/// # Errors
/// [`LoadError::NotFound`] when the binary does not exist; [`LoadError::Refused`] without a
/// model to serve, or for a model that listens on a socket without one.
pub fn vllm_serve(
    model: &ModelConfig,
    replica: u32,
    free_port: u16,
    socket: Option<&Path>,
) -> Result<Launch, LoadError> {
    let BackendSettings::VllmServe { engine, serve } = &model.settings else {
        return Err(wrong_backend(model));
    };
    let VllmServeSettings { vllm_host: host, vllm_port: port, .. } = serve;
    let program = find_program(
        serve.vllm_binary_path.as_deref().unwrap_or("vllm"),
        "vllm_binary_path",
        "install vLLM (`pip install vllm`) on a machine with a GPU",
    )?;
    let target = vllm_target(model).ok_or_else(|| LoadError::Refused {
        message: format!(
            "model '{}' needs vllm_model or model_path: what `vllm serve` loads",
            model.name
        ),
    })?;
    let sleeps = engine.sleeps();
    let socket = socket.filter(|_| on_socket(serve));
    if on_socket(serve) && socket.is_none() {
        return Err(LoadError::Refused {
            message: format!("model '{}': its child needs a Unix socket", model.name),
        });
    }
    if target.starts_with('-') {
        return Err(LoadError::Refused {
            message: format!(
                "model '{}': what `vllm serve` loads ({target:?}) must not start with `-`",
                model.name
            ),
        });
    }
    let host = host.clone().unwrap_or_else(|| LOOPBACK.to_owned());
    let port = port.map_or(free_port, |p| p.saturating_add(replica as u16));
    // vLLM reads its flags with argparse: `--flag=value` is one element that no value can
    // turn into another flag (`--served-model-name` takes `nargs="+"`: a name after it as
    // its own element would be followed by whatever came next).
    let mut args = Args::joined();
    args.0.extend(["serve".to_owned(), target.to_owned()]);
    match socket {
        Some(socket) => args.push2("--uds", socket.display()),
        None => {
            args.push2("--host", &host);
            args.push2("--port", port);
        }
    }
    // One name: requests that name an alias are renamed to it on the way ([`served_name`]).
    args.push2("--served-model-name", &model.name);
    engine_args(engine, &mut args);
    if sleeps {
        args.0.push("--enable-sleep-mode".to_owned());
    }
    let extra = serve.vllm_extra_args.as_deref().unwrap_or_default();
    let tensor_parallel = ["--tensor-parallel-size", "-tp"];
    if engine.vllm_tensor_parallel_size.is_none()
        && model.gpu_split.get() > 1
        && !has_flag(extra, &tensor_parallel)
    {
        args.push2("--tensor-parallel-size", model.gpu_split);
    }
    args.0.extend(extra.iter().cloned());
    let api_key = child_key(serve.vllm_api_key.as_ref())?;
    let mut env: Vec<(String, String)> =
        serve.vllm_env.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.retain(|(k, _)| k != "VLLM_API_KEY" && k != "VLLM_SERVER_DEV_MODE");
    env.push(("VLLM_API_KEY".to_owned(), api_key.clone()));
    // Development mode opens routes without a key: on only for a child on its private
    // socket, and off otherwise whatever `hangard`'s environment (`VLLM_*` passes) or
    // `vllm_env` say.
    let dev_mode = if sleeps { "1" } else { "0" };
    env.push(("VLLM_SERVER_DEV_MODE".to_owned(), dev_mode.to_owned()));
    Ok(Launch {
        program,
        args: args.0,
        env,
        pass_env: model.pass_env.clone(),
        library_path: serve.vllm_library_path.clone(),
        host,
        port,
        socket: socket.map(Path::to_path_buf),
        api_key: Some(api_key),
    })
}

/// Whether a `vllm_serve` child listens on a private Unix socket: unless the operator named
/// its host or port (a model that sleeps may name neither).
pub(crate) fn on_socket(serve: &VllmServeSettings) -> bool {
    serve.vllm_host.is_none() && serve.vllm_port.is_none()
}

/// Whether `args` set one of `flags` (as `--flag value` or `--flag=value`).
fn has_flag(args: &[String], flags: &[&str]) -> bool {
    args.iter().any(|a| flags.contains(&a.split_once('=').map_or(a.as_str(), |(flag, _)| flag)))
}

/// The key a child requires of every request: the configured one (the config's author may
/// want to reach the engine directly), else 32 random bytes in hex, made for this child alone.
///
/// # Errors
/// [`LoadError::Refused`] when the system has no randomness to give.
fn child_key(configured: Option<&hangar_config::Secret>) -> Result<String, LoadError> {
    if let Some(key) = configured {
        return Ok(key.expose().to_owned());
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| LoadError::Refused {
        message: format!("no random bytes for the engine's API key: {e}"),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What `vllm serve` loads: `vllm_model`, else `model_path`.
pub(crate) fn vllm_target(model: &ModelConfig) -> Option<&str> {
    match &model.settings {
        BackendSettings::VllmServe { serve, .. } => {
            serve.vllm_model.as_deref().or(model.model_path.as_deref())
        }
        _ => model.model_path.as_deref(),
    }
}

/// The `vllm_*` engine flags.
fn engine_args(e: &VllmSettings, args: &mut Args) {
    args.opt("--max-model-len", e.vllm_max_model_len);
    args.opt("--kv-cache-dtype", e.vllm_kv_cache_dtype.as_deref());
    args.opt("--kv-cache-memory-bytes", e.vllm_kv_cache_memory_bytes);
    args.opt("--gpu-memory-utilization", e.vllm_gpu_memory_utilization);
    args.opt("--dtype", e.vllm_dtype.as_deref());
    args.opt("--tensor-parallel-size", e.vllm_tensor_parallel_size);
    if let Some(method) = &e.vllm_speculative_method {
        let mut config = Map::new();
        config.insert("method".to_owned(), json!(method));
        if let Some(model) = &e.vllm_speculative_model {
            config.insert("model".to_owned(), json!(model));
        }
        if let Some(n) = e.vllm_num_speculative_tokens {
            config.insert("num_speculative_tokens".to_owned(), json!(n));
        }
        args.push2("--speculative-config", Value::Object(config));
    }
    let mut kwargs = e.vllm_mm_processor_kwargs.clone().unwrap_or_default();
    if let Some(pixels) = e.vllm_max_pixels {
        kwargs.insert("max_pixels".to_owned(), json!(pixels));
    }
    if !kwargs.is_empty() {
        args.push2("--mm-processor-kwargs", Value::Object(kwargs));
    }
}

/// The name a child knows its model by, and what a forwarded request's `model` becomes
/// when the client named one of the model's aliases (`None`: the body passes as it is).
pub(crate) fn served_name(model: &ModelConfig) -> Option<String> {
    (!model.aliases.is_empty()).then(|| model.name.to_string())
}

/// An argv under construction: a flag and its value as one element (`--flag=value`) for
/// engines that parse that form, else as two, for `llama-server`, whose parser takes the
/// element after a flag as its value whatever it starts with.
#[derive(Default)]
struct Args(Vec<String>, bool);

impl Args {
    /// Flags and values joined with `=`.
    fn joined() -> Self {
        Self(Vec::new(), true)
    }

    fn push2(&mut self, flag: &str, value: impl std::fmt::Display) {
        if self.1 {
            self.0.push(format!("{flag}={value}"));
        } else {
            self.0.push(flag.to_owned());
            self.0.push(value.to_string());
        }
    }

    fn opt(&mut self, flag: &str, value: Option<impl std::fmt::Display>) {
        if let Some(value) = value {
            self.push2(flag, value);
        }
    }
}

fn switch(s: Switch) -> &'static str {
    match s {
        Switch::On => "on",
        Switch::Off => "off",
        Switch::Auto => "auto",
    }
}

fn wrong_backend(model: &ModelConfig) -> LoadError {
    LoadError::Refused { message: format!("model '{}' uses backend {}", model.name, model.backend) }
}

/// `program` itself when it names a path, else its first match on `PATH`.
fn exists(file: &str, field: &str) -> Result<(), LoadError> {
    if Path::new(file).exists() {
        Ok(())
    } else {
        Err(LoadError::NotFound {
            path: file.to_owned(),
            message: format!("{field} `{file}` does not exist"),
        })
    }
}
