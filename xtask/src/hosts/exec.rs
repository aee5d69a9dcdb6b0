//! Finding and running the system's tools (`ip`, `tc`, `ssh`, ...), and
//! reading and writing the state folder's files.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where `name` is: itself if it is a path, else the first match on `PATH`,
/// then in the sbin folders (not on every user's `PATH`).
pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `name`'s full path where found, else `name` (to fail when run).
pub(super) fn tool(name: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `argv` and returns its stdout; fails with its stderr if it fails.
pub(super) fn exec(argv: &[&str]) -> Result<String> {
    let (program, args) = argv.split_first().context("an empty command")?;
    let out = Command::new(tool(program))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{program}`"))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A path as UTF-8 (to pass to commands and write into configs).
pub(super) fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("the path {} is not UTF-8", p.display()))
}

pub(super) fn read(p: &Path) -> Result<String> {
    fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

pub(super) fn write(p: &Path, text: &str) -> Result<()> {
    let mut f = fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", p.display()))
}

/// The named network namespaces (`ip netns list`).
pub(super) fn list_namespaces() -> Result<Vec<String>> {
    Ok(exec(&["ip", "netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect())
}
