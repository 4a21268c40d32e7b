//! Keys from files, and the warning for keys given on the command line (which every local
//! user can read in `/proc/<pid>/cmdline`).

use std::io::Read;
use std::path::Path;

/// The largest key file read.
const MAX_KEY_FILE_BYTES: u64 = 64 << 10;

/// The keys of a key file: one per line, trimmed; blank lines and lines starting with `#`
/// skipped.
///
/// # Errors
/// The file cannot be read, is larger than 64 KiB, is not UTF-8, or holds no key.
pub(crate) fn read_key_file(path: &Path) -> Result<Vec<String>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!("{} is larger than {MAX_KEY_FILE_BYTES} bytes", path.display()));
    }
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Err(format!("{} holds no key", path.display()));
    }
    Ok(keys)
}

/// The key flags given with a value on the command line `args` (`--admin-api-key`,
/// `--inference-api-key`; not their `-file` forms, nor their environment variables).
pub(crate) fn keys_on_the_command_line(
    args: impl IntoIterator<Item = String>,
) -> Vec<&'static str> {
    let mut found = Vec::new();
    for arg in args {
        for flag in ["--admin-api-key", "--inference-api-key"] {
            let given = arg == flag || arg.strip_prefix(flag).is_some_and(|r| r.starts_with('='));
            if given && !found.contains(&flag) {
                found.push(flag);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_flags_on_the_command_line_are_found_and_their_file_forms_are_not() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            keys_on_the_command_line(args(&["hangard", "serve", "--admin-api-key", "k"])),
            ["--admin-api-key"]
        );
        assert_eq!(
            keys_on_the_command_line(args(&[
                "hangard",
                "--inference-api-key=a",
                "--inference-api-key",
                "b",
                "--admin-api-key=k"
            ])),
            ["--inference-api-key", "--admin-api-key"]
        );
        let files = args(&["hangard", "--admin-api-key-file", "/k", "--inference-api-key-file=/i"]);
        assert!(keys_on_the_command_line(files).is_empty());
    }

    #[test]
    fn a_key_file_holds_keys_one_a_line_and_an_empty_or_huge_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("hangard-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, "# inference keys\n k1 \n\nk2\n").unwrap();
        assert_eq!(read_key_file(&file).unwrap(), ["k1", "k2"]);
        std::fs::write(&file, "# nothing\n\n").unwrap();
        assert!(read_key_file(&file).unwrap_err().contains("holds no key"));
        std::fs::write(&file, "k".repeat(70_000)).unwrap();
        assert!(read_key_file(&file).unwrap_err().contains("larger than"));
        assert!(read_key_file(&dir.join("missing")).unwrap_err().contains("cannot open"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
