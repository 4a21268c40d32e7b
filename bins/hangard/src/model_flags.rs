//! Lemonade's model-wide `serve` flags (`--ctx-size`, `--llamacpp-args`, `--llamacpp`):
//! each patches a field of every model it concerns, over the config, and every config rule
//! holds for the result.

use std::collections::BTreeSet;
use std::num::NonZeroU32;

use anyhow::Result;
use clap::Args;
use hangar_config::{
    BackendSettings, Config, LLAMA_SERVER_MANAGED_ARGS, LemonadeArgs, ModelConfig, ModelName,
};

/// Lemonade's model-wide `serve` flags. Each sets a field of every model it concerns, over
/// the config; a load request's own values still win, since the runtime merges them over
/// the model as patched here.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ModelFlags {
    /// Context size of every model whose backend has one (`llama_server_n_ctx`,
    /// `gguf_n_ctx`, `vllm_max_model_len`, `exllama_cache_size`).
    #[arg(long, value_name = "N", env = "HANGAR_CTX_SIZE")]
    pub(crate) ctx_size: Option<NonZeroU32>,
    /// Extra `llama-server` arguments, split on whitespace, replacing
    /// `llama_server_extra_args` of every `llama_server` model. Hangar's own (`--port`,
    /// `--host`, `-m`, `--model`) are refused.
    #[arg(long, value_name = "ARGS", env = "HANGAR_LLAMACPP_ARGS", allow_hyphen_values = true)]
    pub(crate) llamacpp_args: Option<String>,
    /// A `llama-server` build named in the models' `llama_server_backends` (e.g. `vulkan`):
    /// every `llama_server` model that names it runs that binary; the others keep theirs.
    #[arg(long, value_name = "NAME", env = "HANGAR_LLAMACPP")]
    pub(crate) llamacpp: Option<String>,
}

/// Applies the model-wide flags to `config`: each affected model's configured object is
/// patched and parsed again, so every config rule holds for the result. Returns the
/// `llama_server` models that `--llamacpp` left on their own binary.
pub(crate) fn apply_model_flags(config: &mut Config, flags: &ModelFlags) -> Result<Vec<ModelName>> {
    let lemonade = LemonadeArgs {
        ctx_size: flags.ctx_size,
        llamacpp_args: flags.llamacpp_args.as_deref().map(llamacpp_args).transpose()?,
        llamacpp_backend: flags.llamacpp.clone(),
    };
    let kept = match &flags.llamacpp {
        Some(build) => models_without_build(&config.models, build)?,
        None => Vec::new(),
    };
    for model in &mut config.models {
        // A flag applies to every model that can take it; the others keep their own.
        let patch: serde_json::Map<String, serde_json::Value> = lemonade
            .map(model)
            .into_iter()
            .filter_map(|m| m.field.ok())
            .map(|(field, value)| (field.to_owned(), value))
            .collect();
        if patch.is_empty() {
            continue;
        }
        let mut raw = model.raw().clone();
        raw.extend(patch);
        *model =
            ModelConfig::parse(&model.name, &serde_json::Value::Object(raw)).map_err(|errors| {
                let problems: Vec<String> =
                    errors.iter().map(|e| format!("{}: {}", e.path, e.message)).collect();
                anyhow::anyhow!(
                    "the serve flags make model `{}` invalid: {}",
                    model.name,
                    problems.join("; ")
                )
            })?;
    }
    Ok(kept)
}

/// `--llamacpp-args` split on whitespace, refusing the arguments Hangar sets itself (also
/// as `--flag=value`).
fn llamacpp_args(args: &str) -> Result<Vec<String>> {
    let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    for arg in &args {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
        if LLAMA_SERVER_MANAGED_ARGS.contains(&flag) {
            anyhow::bail!(
                "--llamacpp-args: `{flag}` is managed by Hangar and cannot be passed (managed: {})",
                LLAMA_SERVER_MANAGED_ARGS.join(", ")
            );
        }
    }
    Ok(args)
}

/// The `llama_server` models whose `llama_server_backends` lack `build`.
///
/// # Errors
/// When no model has it, naming the builds the config does know.
fn models_without_build(models: &[ModelConfig], build: &str) -> Result<Vec<ModelName>> {
    let mut known = BTreeSet::new();
    let mut without = Vec::new();
    let mut found = false;
    for model in models {
        let BackendSettings::LlamaServer(server) = &model.settings else { continue };
        let builds = server.llama_server_backends.iter().flatten();
        known.extend(builds.map(|(name, _)| name.as_str()));
        match server.llama_server_backends.as_ref().is_some_and(|b| b.contains_key(build)) {
            true => found = true,
            false => without.push(model.name.clone()),
        }
    }
    if !found {
        let known = match known.is_empty() {
            true => "none".to_owned(),
            false => known.into_iter().collect::<Vec<_>>().join(", "),
        };
        anyhow::bail!(
            "--llamacpp: no llama_server model names `{build}` in llama_server_backends (known: {known})"
        );
    }
    Ok(without)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};

    fn config() -> Config {
        Config::from_value(&json!({ "models": {
            "server": {
                "backend": "llama_server", "model_path": "/m/a.gguf",
                "llama_server_n_ctx": 2048, "llama_server_extra_args": ["--jinja"],
                "llama_server_binary_path": "/opt/cpu/llama-server",
                "llama_server_backends": {
                    "vulkan": "/opt/vulkan/llama-server", "rocm": "/opt/rocm/llama-server"
                }
            },
            "server-rocm": {
                "backend": "llama_server", "model_path": "/m/b.gguf",
                "llama_server_backends": { "rocm": "/opt/rocm/llama-server" }
            },
            "gguf": { "backend": "llama_cpp", "model_path": "/m/c.gguf", "gguf_n_ctx": 4096 },
            "vllm": { "backend": "vllm", "model_path": "/m/d" },
            "vllm-serve": { "backend": "vllm_serve", "model_path": "/m/e" },
            "exl": { "backend": "exllamav3", "model_path": "/m/f" },
            "ct2": { "backend": "ct2", "model_path": "/m/g" },
            "remote": { "backend": "openai_remote", "openai_base_url": "https://x/v1" },
            "stub": { "backend": "stub" }
        }}))
        .unwrap()
    }

    fn flags(
        ctx_size: Option<u32>,
        llamacpp_args: Option<&str>,
        llamacpp: Option<&str>,
    ) -> ModelFlags {
        ModelFlags {
            ctx_size: ctx_size.and_then(NonZeroU32::new),
            llamacpp_args: llamacpp_args.map(str::to_owned),
            llamacpp: llamacpp.map(str::to_owned),
        }
    }

    /// Applies `flags` and returns, per model, the definition fields that changed (with
    /// their new values) and the models `--llamacpp` left alone.
    fn changes(flags: &ModelFlags) -> (Value, Vec<String>) {
        let before = config();
        let mut after = before.clone();
        let kept = apply_model_flags(&mut after, flags).unwrap();
        let mut changed = Map::new();
        for (old, new) in before.models.iter().zip(&after.models) {
            assert_eq!(old.name, new.name, "model order is kept");
            let (name, old, new) = (old.name.to_string(), old.definition(), new.definition());
            assert_eq!(old.keys().collect::<Vec<_>>(), new.keys().collect::<Vec<_>>());
            let fields: Map<String, Value> =
                new.into_iter().filter(|(k, v)| old.get(k) != Some(v)).collect();
            if !fields.is_empty() {
                changed.insert(name, Value::Object(fields));
            }
        }
        (Value::Object(changed), kept.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn each_flag_changes_only_its_field_of_the_backends_that_have_it() {
        let vulkan = "/opt/vulkan/llama-server";
        let rocm = "/opt/rocm/llama-server";
        let cases = [
            (flags(None, None, None), json!({}), vec![]),
            (
                flags(Some(8192), None, None),
                json!({
                    "server": { "llama_server_n_ctx": 8192 },
                    "server-rocm": { "llama_server_n_ctx": 8192 },
                    "gguf": { "gguf_n_ctx": 8192 },
                    "vllm": { "vllm_max_model_len": 8192 },
                    "vllm-serve": { "vllm_max_model_len": 8192 },
                    "exl": { "exllama_cache_size": 8192 },
                }),
                vec![],
            ),
            (
                flags(None, Some("  -fa on\t--mlock \n--jinja=x "), None),
                json!({
                    "server": { "llama_server_extra_args": ["-fa", "on", "--mlock", "--jinja=x"] },
                    "server-rocm": { "llama_server_extra_args": ["-fa", "on", "--mlock", "--jinja=x"] },
                }),
                vec![],
            ),
            (
                flags(None, Some(""), None),
                json!({
                    "server": { "llama_server_extra_args": [] },
                    "server-rocm": { "llama_server_extra_args": [] },
                }),
                vec![],
            ),
            (
                flags(None, None, Some("rocm")),
                json!({
                    "server": { "llama_server_binary_path": rocm },
                    "server-rocm": { "llama_server_binary_path": rocm },
                }),
                vec![],
            ),
            (
                flags(None, None, Some("vulkan")),
                json!({ "server": { "llama_server_binary_path": vulkan } }),
                vec!["server-rocm"],
            ),
            (
                flags(Some(512), Some("--mlock"), Some("vulkan")),
                json!({
                    "server": {
                        "llama_server_n_ctx": 512,
                        "llama_server_extra_args": ["--mlock"],
                        "llama_server_binary_path": vulkan,
                    },
                    "server-rocm": {
                        "llama_server_n_ctx": 512,
                        "llama_server_extra_args": ["--mlock"],
                    },
                    "gguf": { "gguf_n_ctx": 512 },
                    "vllm": { "vllm_max_model_len": 512 },
                    "vllm-serve": { "vllm_max_model_len": 512 },
                    "exl": { "exllama_cache_size": 512 },
                }),
                vec!["server-rocm"],
            ),
        ];
        for (flags, expected, kept) in cases {
            let (changed, left) = changes(&flags);
            assert_eq!(changed, expected, "{flags:?}");
            assert_eq!(left, kept, "{flags:?}");
        }
    }

    #[test]
    fn patched_models_keep_their_raw_object_for_load_overrides() {
        let mut config = config();
        apply_model_flags(&mut config, &flags(Some(8192), None, Some("vulkan"))).unwrap();
        let server = config.model("server").unwrap();
        assert_eq!(server.raw()["llama_server_n_ctx"], 8192);
        assert_eq!(server.raw()["llama_server_binary_path"], "/opt/vulkan/llama-server");
        assert_eq!(server.raw()["llama_server_extra_args"], json!(["--jinja"]), "untouched");
        let BackendSettings::LlamaServer(s) = &server.settings else { panic!("llama_server") };
        assert_eq!(s.llama_server_n_ctx, Some(8192), "the typed settings follow the raw object");
    }

    #[test]
    fn managed_llamacpp_args_are_refused_in_either_form() {
        for args in ["--port 9000", "--jinja --host=0.0.0.0", "-m /x.gguf", "--model=/x.gguf"] {
            let mut config = config();
            let before = config.clone();
            let err = apply_model_flags(&mut config, &flags(Some(8192), Some(args), None))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("--llamacpp-args: `-"), "{args}: {err}");
            assert!(err.contains("is managed by Hangar"), "{args}: {err}");
            assert_eq!(config, before, "{args}: nothing is patched");
        }
        // Refused even when no model runs llama-server.
        let mut config = Config::from_value(&json!({})).unwrap();
        assert!(apply_model_flags(&mut config, &flags(None, Some("--port 1"), None)).is_err());
    }

    #[test]
    fn an_unknown_llamacpp_build_is_refused_naming_the_known_ones() {
        let mut config = config();
        let err = apply_model_flags(&mut config, &flags(None, None, Some("cuda")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`cuda`"), "{err}");
        assert!(err.ends_with("(known: rocm, vulkan)"), "{err}");
        let mut empty = Config::from_value(&json!({})).unwrap();
        let err = apply_model_flags(&mut empty, &flags(None, None, Some("cuda")))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("(known: none)"), "{err}");
    }

    #[test]
    fn a_value_the_backend_rejects_is_refused_with_its_config_path() {
        let mut config = config();
        let err =
            apply_model_flags(&mut config, &flags(Some(1000), None, None)).unwrap_err().to_string();
        assert!(err.contains("model `exl`"), "{err}");
        assert!(err.contains("models.exl.exllama_cache_size: must be a multiple of 256"), "{err}");
    }
}
