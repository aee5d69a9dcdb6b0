//! Running cargo and the workspace's binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs a cargo command in the workspace root and fails if it fails.
pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .status()
        .with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The target folder (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Builds the launcher and the trainer in `profile` (`release` or `dev`) and
/// returns the folder holding them.
pub fn build_trainer(profile: &str, build: bool) -> Result<PathBuf> {
    if build {
        cargo(&[
            "build",
            "--profile",
            profile,
            "-p",
            "mlx-dist",
            "-p",
            "mlx-llama",
            "--bins",
        ])?;
    }
    let dir = target_dir().join(if profile == "dev" { "debug" } else { profile });
    for bin in ["mlx-launch", "mlx-llama"] {
        let p = dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
        if !p.exists() {
            bail!(
                "{} is missing: build it with `cargo build --profile {profile} -p mlx-dist -p mlx-llama --bins`",
                p.display()
            );
        }
    }
    Ok(dir)
}
