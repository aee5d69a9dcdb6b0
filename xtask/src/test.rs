//! `cargo xtask test`: the whole suite, as CI runs it.

use anyhow::Result;

use crate::util::cargo;

/// fmt check, clippy with -D warnings, then every test of the workspace;
/// then the MPI backend (feature `mlx-dist/mpi`): clippy and its multi-process
/// tests under `mpirun`, building only `mlx-dist` again with the feature.
/// Without Open MPI they are skipped with a reason, unless `CI` is set.
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
    if mpi_installed() || std::env::var_os("CI").is_some() {
        cargo(&[
            "clippy",
            "-p",
            "mlx-dist",
            "--all-targets",
            "--features",
            "mpi",
            "--",
            "-D",
            "warnings",
        ])?;
        cargo(&[
            "test",
            "-p",
            "mlx-dist",
            "--features",
            "mpi",
            "--test",
            "mpi",
        ])?;
    } else {
        eprintln!(
            "xtask test: skipping the MPI backend: mpirun/mpicc not found \
             (Debian: libopenmpi-dev openmpi-bin clang libclang-dev)"
        );
    }
    Ok(())
}

/// Whether Open MPI's launcher and compiler wrapper are on the PATH.
fn mpi_installed() -> bool {
    ["mpirun", "mpicc"].iter().all(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}
