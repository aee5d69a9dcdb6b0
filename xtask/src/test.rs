//! `cargo xtask test`: the whole suite, as CI runs it.

use std::ffi::OsStr;

use anyhow::{Result, bail};

use crate::util::{cargo, cargo_with_env};
use crate::{fuzz, hosts, hosts_lock, macos_check};

/// The layering table (`layers.toml`, see [`crate::layers`]), fmt check,
/// clippy with -D warnings (for this host and for mlx-array without its GPU
/// backend), rustdoc with -D warnings, clippy for macOS on Apple
/// silicon (see [`macos_check`]), then every test of the workspace;
/// then every fuzz target of `fuzz/` for a few seconds (see [`fuzz`]);
/// then the MPI backend (feature `mlx-dist/mpi`): clippy and its multi-process
/// tests under `mpirun`, and the trainer's fully sharded run over MPI
/// (`mlx-llama`'s feature `mpi`), building the crates above `mlx-dist` again
/// with the feature;
/// then the multi-host tests across two emulated hosts (`xtask hosts`).
/// Without the macOS target, a C++ compiler (libFuzzer), Open MPI, or
/// where hosts cannot be emulated (not root, not Linux, no sshd), those are
/// skipped with a reason, unless `CI` is set. Under CI
/// the Slurm test must run too (`MLX_DIST_TEST_SLURM`).
pub fn run() -> Result<()> {
    let ci = std::env::var_os("CI").is_some();
    // The layering table first: it takes a second, and names the file and
    // line of an import that breaks a crate's layers (`xtask layers`).
    crate::layers::run(crate::layers::Args::default())?;
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // mlx-array without its `gpu` feature (the layers above may depend on it
    // so): the stub backend must keep every GPU entry point's signature, and
    // every test, example and bench builds without it (`gpu_conformance`
    // requires the feature).
    cargo(&[
        "clippy",
        "-p",
        "mlx-array",
        "--no-default-features",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // The crates' documentation: every intra-doc link resolves, no public
    // doc links a private item, no stray HTML.
    cargo_with_env(
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", OsStr::new("-D warnings"))],
    )?;
    match macos_check::unavailable() {
        None => macos_check::run()?,
        Some(why) if ci => bail!("CI is set, but the macOS check cannot run: {why}"),
        Some(why) => eprintln!("xtask test: skipping the macOS check: {why}"),
    }
    let slurm: &[(&str, &OsStr)] = if ci {
        &[("MLX_DIST_TEST_SLURM", OsStr::new("1"))]
    } else {
        &[]
    };
    cargo_with_env(&["test", "--workspace", "--no-fail-fast"], slurm)?;
    match fuzz::unavailable() {
        None => {
            fuzz::all(fuzz::CI_SECONDS)?;
            // A one-off CI machine needs the disk more than the 1.3 GB
            // build (the stages after this one build again).
            if ci {
                let _ = std::fs::remove_dir_all(crate::util::root().join("fuzz/target"));
            }
        }
        Some(why) if ci => bail!("CI is set, but the fuzz targets cannot run: {why}"),
        Some(why) => eprintln!("xtask test: skipping the fuzz targets: {why}"),
    }
    if mpi_installed() || ci {
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
        // The trainer's fully sharded layout over MPI beside the ring's.
        cargo(&[
            "test",
            "-p",
            "mlx-llama",
            "--features",
            "mpi",
            "--test",
            "sharding",
            "zero3_trains_alike_over_every_transport",
        ])?;
    } else {
        eprintln!(
            "xtask test: skipping the MPI backend: mpirun/mpicc not found \
             (Debian: libopenmpi-dev openmpi-bin clang libclang-dev)"
        );
    }
    multi_host(ci)
}

/// `mlx-dist`'s multi-host tests across two emulated hosts, under the hosts'
/// machine-wide lock; the hosts come down afterwards, also on failure.
fn multi_host(ci: bool) -> Result<()> {
    if let Err(why) = hosts::available() {
        if ci {
            bail!("CI is set, but the multi-host tests cannot run: {why}");
        }
        eprintln!("xtask test: skipping the multi-host tests: {why}");
        return Ok(());
    }
    let _lock = hosts_lock::take()?;
    let guard = hosts::HostsGuard::up(2, None)?;
    cargo_with_env(
        &["test", "-p", "mlx-dist", "--test", "multihost"],
        &[("MLX_TEST_HOSTS", guard.state_dir.as_os_str())],
    )
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
