//! `children`: what of Hangar's environment reaches the engine processes it starts
//! ([`ChildEnv`]).
//!
//! A child starts from an allow-list, not from a copy of `hangard`'s environment: the
//! variables an engine needs to find its libraries, GPUs, caches and Python ([`CHILD_ENV`]),
//! those the operator adds (`children.pass_env`), and the model's own configured variables
//! (`vllm_env`). Never `HANGAR_*` (Hangar's keys live there), nor a name the operator lists as
//! secret (`children.secret_env`), nor a variable a model reads its remote API key from
//! (`openai_api_key_env`). Read at start; a reload does not change it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::kinds::BackendKind;
use crate::sections::Section;
use crate::validate::Problems;

/// The variables every engine child gets from Hangar's environment when set: names, or
/// prefixes ending in `*`. What finds programs and libraries (`PATH`, `LD_LIBRARY_PATH`),
/// the user, locale and temporary files, GPUs (`CUDA_*`, `NVIDIA_*`, ROCm's `HIP_*`,
/// `ROCR_*`, `HSA_*`), model caches and hubs (`HF_*`, `XDG_CACHE_HOME`), the engines' own
/// settings (`VLLM_*`, `GGML_*`, `OMP_*`, `TORCH_*`, `TRITON_*`, `NCCL_*`, `TRANSFORMERS_*`,
/// `TOKENIZERS_PARALLELISM`), Python (`PYTHON*`, `VIRTUAL_ENV`) and the network a hub
/// download goes through (proxies, CA bundles). Not `LLAMA_ARG_*`: those would change
/// `llama-server`'s flags behind Hangar's back.
pub const CHILD_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NVIDIA_*",
    "HIP_*",
    "ROCR_*",
    "HSA_*",
    "HF_*",
    "XDG_CACHE_HOME",
    "VLLM_*",
    "GGML_*",
    "OMP_*",
    "TORCH_*",
    "TRITON_*",
    "NCCL_*",
    "TRANSFORMERS_*",
    "TOKENIZERS_PARALLELISM",
    "PYTHON*",
    "VIRTUAL_ENV",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

/// Hangar's own variables (its keys among them): never passed to a child.
pub const HANGAR_ENV: &str = "HANGAR_*";

/// Hub credentials the built-in list would pass (`HF_*`) but no child gets unless the
/// operator names one exactly, in `children.pass_env` (every child) or a model's own
/// `pass_env` (that model's: one on a gated hub repository).
pub const WITHHELD_ENV: &[&str] = &["HF_TOKEN", "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN"];

/// Checks a model's `pass_env`: exact variable names, none of Hangar's own.
pub(crate) fn check_model_pass_env(names: Option<&[String]>, p: &mut Problems<'_>) {
    for (i, name) in names.unwrap_or_default().iter().enumerate() {
        if name.ends_with('*') || !valid_pattern(name) {
            p.push_item(
                "pass_env",
                i,
                format!("`{name}` is not a variable name (letters, digits, `_`)"),
            );
        } else if matches(HANGAR_ENV, name) {
            p.push_item(
                "pass_env",
                i,
                format!("`{name}`: Hangar's own variables are never passed to engines"),
            );
        }
    }
}

/// `children` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ChildrenFields {
    /// More variables engine children get from Hangar's environment, beyond the built-in
    /// list (names, or prefixes ending in `*`). `HANGAR_*` is never passed.
    pass_env: Option<Vec<String>>,
    /// Variables never passed to a child, even when they match the built-in list or
    /// `pass_env` (names, or prefixes ending in `*`); `HF_TOKEN` for one, when no engine
    /// downloads from a gated repository. A model's own configured variables still reach it.
    secret_env: Option<Vec<String>>,
}

/// Whether `pattern` is a variable name, or a prefix of one ending in `*`.
fn valid_pattern(pattern: &str) -> bool {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl Section for ChildrenFields {
    const BACKENDS: &'static [BackendKind] = &[];

    fn check(&self, p: &mut Problems<'_>) {
        for (field, patterns) in [("pass_env", &self.pass_env), ("secret_env", &self.secret_env)] {
            for (i, pattern) in patterns.iter().flatten().enumerate() {
                if !valid_pattern(pattern) {
                    p.push_item(
                        field,
                        i,
                        format!(
                            "`{pattern}` is not a variable name (letters, digits, `_`), \
                             optionally ending in `*`"
                        ),
                    );
                } else if field == "pass_env" && matches(HANGAR_ENV, pattern) {
                    p.push_item(
                        field,
                        i,
                        format!("`{pattern}`: Hangar's own variables are never passed to engines"),
                    );
                }
            }
        }
    }
}

/// Whether `name` matches `pattern` (a name, or a prefix ending in `*`).
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// Which of Hangar's variables an engine child gets (`children`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChildEnv {
    /// `children.pass_env`.
    pub pass_env: Vec<String>,
    /// `children.secret_env`.
    pub secret_env: Vec<String>,
    /// Every model's `openai_api_key_env`: withheld as secrets are, and not shown as part of
    /// `secret_env` (they are not the operator's list, nor always valid patterns).
    pub key_vars: Vec<String>,
}

impl From<ChildrenFields> for ChildEnv {
    fn from(f: ChildrenFields) -> Self {
        Self {
            pass_env: f.pass_env.unwrap_or_default(),
            secret_env: f.secret_env.unwrap_or_default(),
            key_vars: Vec::new(),
        }
    }
}

impl ChildEnv {
    /// Whether a child gets Hangar's variable `name`: on the built-in list or `pass_env`,
    /// and neither `HANGAR_*`, secret, nor a model's key variable; a hub credential
    /// ([`WITHHELD_ENV`]) only when `pass_env` names it exactly.
    pub fn passes(&self, name: &str) -> bool {
        let listed = CHILD_ENV.iter().copied().chain(self.pass_env.iter().map(String::as_str));
        let secret = std::iter::once(HANGAR_ENV).chain(self.secret_env.iter().map(String::as_str));
        let withheld = WITHHELD_ENV.contains(&name) && !self.pass_env.iter().any(|p| p == name);
        listed.into_iter().any(|p| matches(p, name))
            && !withheld
            && !secret.into_iter().any(|p| matches(p, name))
            && !self.key_vars.iter().any(|var| var == name)
    }

    /// Whether a model whose own `pass_env` is `own` gets Hangar's variable `name`: as
    /// [`Self::passes`] says, or named in `own` (never `HANGAR_*`, a secret of the
    /// operator's, or a model's key variable).
    pub fn passes_for(&self, own: &[String], name: &str) -> bool {
        let secret = std::iter::once(HANGAR_ENV).chain(self.secret_env.iter().map(String::as_str));
        self.passes(name)
            || (own.iter().any(|o| o == name)
                && !secret.into_iter().any(|p| matches(p, name))
                && !self.key_vars.iter().any(|var| var == name))
    }

    /// The effective `children` object, as `config check` shows it (the operator's lists;
    /// the built-in one is [`CHILD_ENV`]).
    pub fn to_json(&self) -> Value {
        json!({ "pass_env": self.pass_env, "secret_env": self.secret_env })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_gets_the_listed_variables_and_never_hangars_or_secret_ones() {
        let env = ChildEnv {
            pass_env: vec!["MY_ENGINE_*".into(), "HANGAR_LEAK".into()],
            secret_env: vec!["HF_TOKEN".into(), "VLLM_SECRET*".into()],
            key_vars: vec!["HF_REMOTE_KEY".into()],
        };
        let cases = [
            ("PATH", true),
            ("LC_ALL", true),
            ("CUDA_VISIBLE_DEVICES", true),
            ("HF_HOME", true),
            ("PYTHONPATH", true),
            ("MY_ENGINE_THREADS", true),
            // Neither listed nor added.
            ("AWS_SECRET_ACCESS_KEY", false),
            ("LLAMA_ARG_PORT", false),
            ("PATHOLOGY", false),
            // Hangar's own, even when a pass_env pattern names one.
            ("HANGAR_ADMIN_KEY", false),
            ("HANGAR_INFERENCE_KEYS", false),
            ("HANGAR_LEAK", false),
            // Secret over listed.
            ("HF_TOKEN", false),
            // Hub credentials are withheld by default.
            ("HF_TOKEN_PATH", false),
            ("HF_HUB_OFFLINE", true),
            ("VLLM_SECRET_SAUCE", false),
            ("VLLM_USE_V1", true),
            // A model's remote key variable, matched by name only.
            ("HF_REMOTE_KEY", false),
            ("HF_REMOTE_KEYS", true),
        ];
        for (name, passes) in cases {
            assert_eq!(env.passes(name), passes, "{name}");
        }
    }

    #[test]
    fn hub_credentials_reach_only_a_model_or_children_that_name_them() {
        let plain = ChildEnv::default();
        for name in WITHHELD_ENV {
            assert!(!plain.passes(name), "{name} is withheld by default");
            assert!(
                plain.passes_for(&[(*name).to_owned()], name),
                "{name} when the model names it"
            );
        }
        assert!(plain.passes("HF_HOME"));
        let everyone = ChildEnv { pass_env: vec!["HF_TOKEN".into()], ..ChildEnv::default() };
        assert!(everyone.passes("HF_TOKEN"));
        assert!(!everyone.passes("HF_TOKEN_PATH"), "a prefix or another name opens nothing");
        let secret = ChildEnv { secret_env: vec!["HF_TOKEN".into()], ..ChildEnv::default() };
        assert!(!secret.passes_for(&["HF_TOKEN".into()], "HF_TOKEN"), "the operator's secret wins");
        assert!(!plain.passes_for(&["HANGAR_ADMIN_KEY".into()], "HANGAR_ADMIN_KEY"));
        let models = serde_json::json!({ "models": { "m": { "backend": "stub",
            "pass_env": ["HF_TOKEN", "HANGAR_ADMIN_KEY", "HF_*"] } } });
        let Err(crate::ConfigError::Invalid(errors)) = crate::Config::from_value(&models) else {
            panic!("a model may not pass Hangar's variables or patterns")
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["models.m.pass_env[1]", "models.m.pass_env[2]"]);
    }

    #[test]
    fn patterns_are_names_or_prefixes_and_hangars_variables_cannot_be_passed() {
        let fields: ChildrenFields = serde_json::from_value(json!({
            "pass_env": ["OK_NAME", "PREFIX_*", "", "A-B", "*", "HANGAR_*", "HANGAR_ADMIN_KEY"],
            "secret_env": ["X", "bad name"]
        }))
        .unwrap();
        let mut errors = Vec::new();
        fields.check(&mut Problems::new("children".into(), &mut errors));
        let fields: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            fields,
            [
                "children.pass_env[2]",
                "children.pass_env[3]",
                "children.pass_env[4]",
                "children.pass_env[5]",
                "children.pass_env[6]",
                "children.secret_env[1]"
            ]
        );
    }
}
