//! `cargo xtask test`: the whole suite, as CI runs it.

use anyhow::Result;

use crate::util::cargo;

/// fmt check, clippy with -D warnings, then every test of the workspace.
pub fn run() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace", "--no-fail-fast"])?;
    Ok(())
}
