//! Hangar's fuzz checks: what each fuzz target does with one input, and what it asserts.
//!
//! This crate owns the targets' bodies, not the fuzzer: `fuzz/` (outside the workspace,
//! built by `cargo xtask fuzz` with libFuzzer's coverage flags) calls [`run`] with the
//! fuzzer's bytes, and this crate's tests replay every committed corpus and crash input
//! through the same function on the stable toolchain, so CI checks every past finding.
//!
//! A check panics when an invariant breaks: the fuzzer records the input as a crash. An
//! error answer is not a finding; an untyped one, a panic inside Hangar, an answer that
//! contradicts the input, or a hang is.

mod folder;
mod grpc;
mod server;
mod weights;

/// One fuzz target: its name (the `fuzz/fuzz_targets/<name>.rs` binary, the corpus folder
/// `fuzz/corpus/<name>/`) and its check.
pub struct Target {
    /// The target's name.
    pub name: &'static str,
    /// What it reads, for `cargo xtask fuzz --list`.
    pub reads: &'static str,
    /// The check of one input.
    pub check: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "gguf",
        reads: "a GGUF file: where its tensors lie (`locate_tensors`)",
        check: weights::gguf,
    },
    Target {
        name: "gguf_shape",
        reads: "a GGUF file's attention shape and KV-cache estimate (`gguf_shape`)",
        check: weights::gguf_shape,
    },
    Target {
        name: "safetensors",
        reads: "a safetensors file: where its tensors lie (`locate_tensors`)",
        check: weights::safetensors,
    },
    Target {
        name: "digest",
        reads: "a crafted GGUF or safetensors file, digested whole (`digest`)",
        check: weights::digest,
    },
    Target {
        name: "config",
        reads: "two JSON documents, merged and validated (`settings.json` + `local.json`)",
        check: config,
    },
    Target {
        name: "folder",
        reads: "a model repository folder's `hangar.json` (`ModelRepository::scan`)",
        check: folder::folder,
    },
    Target {
        name: "bodies",
        reads: "a request body for one of the POST routes (OpenAI, admin, Lemonade, v2, weight control)",
        check: server::bodies,
    },
    Target {
        name: "event_id",
        reads: "a `Last-Event-ID` for the admin event stream",
        check: server::event_id,
    },
    Target {
        name: "grpc",
        reads: "a KServe v2 gRPC call: its RPC and message, decoded behind the gate",
        check: grpc::grpc,
    },
];

/// Runs the check of the target called `name` on `data`.
///
/// # Panics
/// When `name` is no target, or the check finds a broken invariant.
pub fn run(name: &str, data: &[u8]) {
    let target = TARGETS.iter().find(|t| t.name == name);
    let target = target.unwrap_or_else(|| panic!("no fuzz target `{name}`"));
    (target.check)(data);
}

/// The config merge and validation: `data` is two JSON documents separated by a NUL byte
/// (the second empty when there is none), read as `settings.json` and `local.json` are.
///
/// Invariants: merging is idempotent (a patch applied twice changes nothing more); the
/// merged value either validates or is refused with at least one error, each naming a path
/// and a message; a validated config's effective JSON validates again.
fn config(data: &[u8]) {
    let (base, patch) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let Ok(base) = serde_json::from_slice::<serde_json::Value>(base) else { return };
    let patch = serde_json::from_slice::<serde_json::Value>(patch).unwrap_or_default();
    let once = hangar_config::merged(base, patch.clone());
    let twice = hangar_config::merged(once.clone(), patch);
    assert_eq!(once, twice, "a patch applied twice changed more");
    match hangar_config::Config::from_value(&once) {
        Ok(config) => {
            // What `config check` shows is itself a config the validator accepts, models and
            // all, with the secrets redacted.
            let effective = config.to_effective_json();
            let again = hangar_config::Config::from_value(&effective);
            let again = again.unwrap_or_else(|e| panic!("the effective config is refused: {e}"));
            assert_eq!(again.models.len(), config.models.len());
        }
        Err(hangar_config::ConfigError::Invalid(errors)) => {
            assert!(!errors.is_empty(), "refused without a reason");
            for error in &errors {
                assert!(!error.message.is_empty(), "an error without a message: {error:?}");
            }
        }
        Err(other) => panic!("validation failed with a non-validation error: {other}"),
    }
}
