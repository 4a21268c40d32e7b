//! The `llama-server` flags a request may pass (Lemonade's `llamacpp_args`): an allow-list
//! of flags that touch neither files, nor the network, nor the engine's auth. Configured
//! `llama_server_extra_args` are the config author's and are not limited by it.

/// Flags a load request may pass to `llama-server`, each with its short and long forms:
/// threads, batch sizes, context and parallel slots, flash attention, cache types, GPU
/// layers and split, memory mapping and locking, the model's own Jinja template, reasoning
/// output, the web UI off, and sampling defaults.
pub const LLAMA_SERVER_REQUEST_ARGS: &[&str] = &[
    "-t",
    "--threads",
    "-tb",
    "--threads-batch",
    "-b",
    "--batch-size",
    "-ub",
    "--ubatch-size",
    "-c",
    "--ctx-size",
    "-np",
    "--parallel",
    "-cb",
    "--cont-batching",
    "-nocb",
    "--no-cont-batching",
    "-fa",
    "--flash-attn",
    "-ctk",
    "--cache-type-k",
    "-ctv",
    "--cache-type-v",
    "-nkvo",
    "--no-kv-offload",
    "-ngl",
    "--gpu-layers",
    "--n-gpu-layers",
    "-sm",
    "--split-mode",
    "-ts",
    "--tensor-split",
    "-mg",
    "--main-gpu",
    "--mlock",
    "--no-mmap",
    "--jinja",
    "--reasoning-format",
    "--reasoning-budget",
    "--no-webui",
    "-n",
    "--n-predict",
    "--keep",
    "--cache-reuse",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--repeat-penalty",
    "--repeat-last-n",
    "--presence-penalty",
    "--frequency-penalty",
    "-s",
    "--seed",
];

/// Checks arguments from a request against [`LLAMA_SERVER_REQUEST_ARGS`]: every flag (an
/// argument starting with `-` that is not a number, also as `--flag=value`) must be listed,
/// and no value may carry a path.
///
/// # Errors
/// The first offending flag or value, with why.
pub fn check_request_args(args: &[String]) -> Result<(), String> {
    for arg in args {
        let number = arg.parse::<f64>().is_ok();
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => (Some(flag), Some(value)),
            _ if arg.starts_with('-') && !number => (Some(arg.as_str()), None),
            _ => (None, Some(arg.as_str())),
        };
        if let Some(flag) = flag
            && !LLAMA_SERVER_REQUEST_ARGS.contains(&flag)
        {
            return Err(format!(
                "`{flag}` may not be passed in a request (it is not one of the flags that touch \
                 neither files, the network nor the engine's auth: {})",
                LLAMA_SERVER_REQUEST_ARGS.join(" ")
            ));
        }
        if let Some(value) = value
            && (value.contains(['/', '\\']) || value.starts_with('~'))
        {
            return Err(format!("`{value}`: values in a request may not carry paths"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> Result<(), String> {
        check_request_args(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn listed_flags_pass_and_the_rest_are_named() {
        for ok in [
            &["--threads", "4", "--no-webui"][..],
            &["-c", "4096", "-fa", "on", "-ctk", "q8_0", "--cache-type-v=q8_0"],
            &["-ngl", "-1", "--tensor-split", "3,1", "--temp", "0.7", "--seed", "-1"],
            &[],
        ] {
            assert_eq!(check(ok), Ok(()), "{ok:?}");
        }
        for (bad, named) in [
            (&["--log-file", "x"][..], "`--log-file`"),
            (&["-hf", "org/model"], "`-hf`"),
            (&["--lora", "a.gguf"], "`--lora`"),
            (&["--path", "x"], "`--path`"),
            (&["--slot-save-path", "x"], "`--slot-save-path`"),
            (&["--api-key", "k"], "`--api-key`"),
            (&["--api-key=k"], "`--api-key`"),
            (&["--chat-template-file", "t.jinja"], "`--chat-template-file`"),
            (&["--port", "9000"], "`--port`"),
            (&["--host=0.0.0.0"], "`--host`"),
            (&["-m", "x.gguf"], "`-m`"),
            (&["--threads", "4", "--model=x.gguf"], "`--model`"),
            (&["--threads", "/etc/passwd"], "`/etc/passwd`"),
            (&["--threads=..\\x"], "`..\\x`"),
            (&["--seed", "~/x"], "`~/x`"),
        ] {
            let err = check(bad).unwrap_err();
            assert!(err.starts_with(named), "{bad:?}: {err}");
        }
    }
}
