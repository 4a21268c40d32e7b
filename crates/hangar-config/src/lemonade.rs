//! Lemonade's model-wide arguments (`ctx_size`, `llamacpp_args`, `llamacpp_backend`) mapped
//! onto a model's own fields: one mapping for `hangard serve`'s flags (`--ctx-size`,
//! `--llamacpp-args`, `--llamacpp`), which apply to every model that has the field, and for
//! `POST /api/v1/load`, which refuses an argument its model cannot take.

use std::num::NonZeroU32;

use serde_json::Value;

use crate::{BackendSettings, ModelConfig, context_size_field};

/// Lemonade's model-wide arguments, as given (the arguments already checked by the caller's
/// own rule: `hangard serve` refuses the flags Hangar manages, a request anything that
/// touches files, the network or the engine's auth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LemonadeArgs {
    /// The context size, for the backend's own context field.
    pub ctx_size: Option<NonZeroU32>,
    /// Extra `llama-server` arguments (`llama_server` models); an empty list clears them.
    pub llamacpp_args: Option<Vec<String>>,
    /// The llama.cpp build to run, one of the model's `llama_server_backends`.
    pub llamacpp_backend: Option<String>,
}

/// Which argument a mapping is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum LemonadeArg {
    /// `ctx_size`.
    CtxSize,
    /// `llamacpp_args`.
    LlamacppArgs,
    /// `llamacpp_backend`.
    LlamacppBackend,
}

/// One argument mapped onto one model: the model's field and its value, or why the model
/// cannot take it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    /// The argument.
    pub arg: LemonadeArg,
    /// The field and value, or why not.
    pub field: Result<(&'static str, Value), String>,
}

impl LemonadeArgs {
    /// Each argument given, mapped onto `model`'s fields.
    pub fn map(&self, model: &ModelConfig) -> Vec<Mapped> {
        let (name, backend) = (&model.name, model.backend);
        let server = match &model.settings {
            BackendSettings::LlamaServer(s) => Some(s),
            _ => None,
        };
        let only_llama_server = |arg: LemonadeArg| {
            format!(
                "{arg} applies only to llama_server models; model '{name}' uses backend {backend}"
            )
        };
        let mut mapped = Vec::new();
        if let Some(size) = self.ctx_size {
            let field = match context_size_field(backend) {
                Some(field) => Ok((field, Value::from(size.get()))),
                None => Err(format!("ctx_size is not supported for backend {backend}")),
            };
            mapped.push(Mapped { arg: LemonadeArg::CtxSize, field });
        }
        // An empty list is given too: it clears the model's extra arguments.
        if let Some(args) = &self.llamacpp_args {
            let arg = LemonadeArg::LlamacppArgs;
            let field = match server {
                Some(_) => Ok(("llama_server_extra_args", Value::from(args.clone()))),
                None => Err(only_llama_server(arg)),
            };
            mapped.push(Mapped { arg, field });
        }
        if let Some(build) = self.llamacpp_backend.as_deref().filter(|b| !b.trim().is_empty()) {
            let arg = LemonadeArg::LlamacppBackend;
            let builds = server.and_then(|s| s.llama_server_backends.as_ref());
            let field = match (server, builds.and_then(|b| b.get(build))) {
                (None, _) => Err(only_llama_server(arg)),
                (Some(_), Some(path)) => {
                    Ok(("llama_server_binary_path", Value::from(path.as_str())))
                }
                (Some(_), None) => {
                    let known: Vec<&str> =
                        builds.map(|b| b.keys().map(String::as_str).collect()).unwrap_or_default();
                    let known = if known.is_empty() {
                        "none configured".to_owned()
                    } else {
                        known.join(", ")
                    };
                    Err(format!(
                        "llamacpp_backend `{build}` is not one of model '{name}''s \
                         llama_server_backends ({known})"
                    ))
                }
            };
            mapped.push(Mapped { arg, field });
        }
        mapped
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn model(name: &str, value: Value) -> ModelConfig {
        ModelConfig::parse(&crate::ModelName::new(name).unwrap(), &value).unwrap()
    }

    /// `(argument, field or "-")` of each mapping.
    fn fields(mapped: &[Mapped]) -> Vec<(&'static str, &'static str)> {
        mapped.iter().map(|m| (m.arg.into(), m.field.as_ref().map_or("-", |(f, _)| *f))).collect()
    }

    #[test]
    fn each_argument_maps_onto_the_field_of_the_models_that_have_it() {
        let args = LemonadeArgs {
            ctx_size: NonZeroU32::new(8192),
            llamacpp_args: Some(vec!["--no-webui".into()]),
            llamacpp_backend: Some("vulkan".into()),
        };
        let server = model(
            "s",
            json!({ "backend": "llama_server", "model_path": "/m/a.gguf",
                    "llama_server_backends": { "vulkan": "/opt/vk/llama-server" } }),
        );
        let gguf = model("g", json!({ "backend": "llama_cpp", "model_path": "/m/a.gguf" }));
        let stub = model("x", json!({ "backend": "stub" }));
        let table: [(&ModelConfig, &[(&str, &str)]); 3] = [
            (
                &server,
                &[
                    ("ctx_size", "llama_server_n_ctx"),
                    ("llamacpp_args", "llama_server_extra_args"),
                    ("llamacpp_backend", "llama_server_binary_path"),
                ],
            ),
            (
                &gguf,
                &[("ctx_size", "gguf_n_ctx"), ("llamacpp_args", "-"), ("llamacpp_backend", "-")],
            ),
            (&stub, &[("ctx_size", "-"), ("llamacpp_args", "-"), ("llamacpp_backend", "-")]),
        ];
        for (model, want) in table {
            assert_eq!(fields(&args.map(model)), want, "{}", model.name);
        }
        let values: Vec<Value> =
            args.map(&server).into_iter().map(|m| m.field.unwrap().1).collect();
        assert_eq!(values, [json!(8192), json!(["--no-webui"]), json!("/opt/vk/llama-server")]);
        let why = args.map(&gguf)[1].field.clone().unwrap_err();
        assert_eq!(
            why,
            "llamacpp_args applies only to llama_server models; model 'g' uses backend llama_cpp"
        );
    }

    #[test]
    fn an_unknown_build_names_the_known_ones_and_nothing_given_maps_nothing() {
        let args =
            LemonadeArgs { llamacpp_backend: Some("rocm".into()), ..LemonadeArgs::default() };
        let server = model(
            "s",
            json!({ "backend": "llama_server", "model_path": "/m/a.gguf",
                    "llama_server_backends": { "vulkan": "/vk", "cpu": "/cpu" } }),
        );
        let why = args.map(&server)[0].field.clone().unwrap_err();
        assert!(
            why.contains("`rocm` is not one of model 's''s llama_server_backends (cpu, vulkan)"),
            "{why}"
        );
        let bare = model("b", json!({ "backend": "llama_server", "model_path": "/m/a.gguf" }));
        assert!(args.map(&bare)[0].field.clone().unwrap_err().contains("(none configured)"));
        let blank = LemonadeArgs { llamacpp_backend: Some(" ".into()), ..LemonadeArgs::default() };
        assert!(blank.map(&server).is_empty());
        let clear = LemonadeArgs { llamacpp_args: Some(Vec::new()), ..LemonadeArgs::default() };
        assert_eq!(clear.map(&server)[0].field, Ok(("llama_server_extra_args", json!([]))));
    }
}
