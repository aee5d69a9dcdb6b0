//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` (one
//! libFuzzer binary, the target named by `MLX_FUZZ_TARGET`), built on the
//! pinned stable toolchain with the instrumentation `cargo fuzz build
//! --sanitizer none` asks rustc for, so neither nightly nor cargo-fuzz is
//! needed; `--asan` builds with nightly and AddressSanitizer instead.
//!
//! Corpora: `fuzz/corpus/<target>/` holds the committed seeds (written by
//! the project's own writers, `cargo xtask fuzz seeds`); what a run finds
//! goes to `fuzz/target/corpus/<target>/`, crashes to
//! `fuzz/artifacts/<target>/`. Neither is committed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use crate::util::root;

/// The flags `cargo fuzz build --sanitizer none` passes: libFuzzer's
/// coverage counters and comparison tracing, and `cfg(fuzzing)`.
const COVERAGE_FLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing";

/// Seconds each target runs for in `cargo xtask test` (`MLX_FUZZ_SECONDS`).
pub const CI_SECONDS: u64 = 4;

/// What `cargo xtask fuzz` does.
#[derive(Subcommand)]
pub enum Cmd {
    /// Lists the targets.
    List,
    /// Runs one target until stopped (Ctrl-C), or for `--seconds`; extra
    /// arguments after `--` go to libFuzzer (`-jobs=4`, `-max_len=65536`...).
    Run {
        /// The target (see `cargo xtask fuzz list`).
        target: String,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
        /// Build with nightly and AddressSanitizer (needs the nightly toolchain).
        #[arg(long)]
        asan: bool,
        /// Optimise the dependencies too (a longer build, into its own
        /// target folder; inputs run 2 to 15 times faster): for long runs.
        #[arg(long)]
        optimized: bool,
        /// Arguments for libFuzzer.
        #[arg(last = true)]
        libfuzzer: Vec<String>,
    },
    /// Runs one input (a crash artifact, say) through a target, once.
    Repro {
        /// The target.
        target: String,
        /// The input file.
        input: PathBuf,
        /// Build with nightly and AddressSanitizer.
        #[arg(long)]
        asan: bool,
    },
    /// Every target for a few seconds each (what `cargo xtask test` runs).
    All {
        /// Seconds per target.
        #[arg(long, default_value_t = CI_SECONDS)]
        seconds: u64,
    },
    /// Rewrites the committed seeds, `fuzz/corpus/<target>/seed-*`.
    Seeds,
}

/// Runs a `cargo xtask fuzz` command.
pub fn run(cmd: Cmd) -> Result<()> {
    if let Some(why) = unavailable() {
        bail!("cannot fuzz here: {why}");
    }
    match cmd {
        Cmd::List => {
            let bin = build(false, false)?;
            for t in targets(&bin)? {
                println!("{t}");
            }
            Ok(())
        }
        Cmd::Run {
            target,
            seconds,
            asan,
            optimized,
            libfuzzer,
        } => {
            let bin = build(asan, optimized)?;
            check_target(&bin, &target)?;
            let mut args: Vec<String> = seconds
                .map(|s| format!("-max_total_time={s}"))
                .into_iter()
                .collect();
            args.extend(libfuzzer);
            let (ok, _) = fuzz(&bin, &target, &args, false)?;
            if !ok {
                bail!("{target} crashed: see fuzz/artifacts/{target}/");
            }
            Ok(())
        }
        Cmd::Repro {
            target,
            input,
            asan,
        } => {
            let input = std::fs::canonicalize(&input)
                .with_context(|| format!("no input {}", input.display()))?;
            let bin = build(asan, false)?;
            check_target(&bin, &target)?;
            let status = target_command(&bin, &target)?
                .arg(&input)
                .status()
                .context("running mlx-fuzz")?;
            if !status.success() {
                bail!("{} crashes {target} ({status})", input.display());
            }
            Ok(())
        }
        Cmd::All { seconds } => all(seconds),
        Cmd::Seeds => {
            let bin = build(false, false)?;
            let corpus = root().join("fuzz/corpus");
            for t in targets(&bin)? {
                let dir = corpus.join(&t);
                if dir.is_dir() {
                    for e in std::fs::read_dir(&dir)? {
                        let p = e?.path();
                        if p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
                        {
                            std::fs::remove_file(&p)?;
                        }
                    }
                }
            }
            let status = Command::new(&bin)
                .env("MLX_FUZZ_SEEDS", &corpus)
                .env("TMPDIR", scratch("seeds")?)
                .status()
                .context("running mlx-fuzz")?;
            if !status.success() {
                bail!("writing the seeds failed ({status})");
            }
            Ok(())
        }
    }
}

/// Why the fuzz targets cannot be built here, if they cannot: libFuzzer
/// (built by `libfuzzer-sys`) is C++, and runs on Linux and macOS.
pub fn unavailable() -> Option<String> {
    if !cfg!(any(target_os = "linux", target_os = "macos")) {
        return Some("libFuzzer runs on Linux and macOS only".into());
    }
    let cxx = std::env::var_os("CXX").unwrap_or_else(|| "c++".into());
    let found = Command::new(&cxx)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        return Some(format!(
            "no C++ compiler ({}) to build libFuzzer with (Debian: g++)",
            cxx.to_string_lossy()
        ));
    }
    None
}

/// `cargo xtask test`'s stage: every target for `seconds` (or
/// `MLX_FUZZ_SECONDS`) each; fails naming the targets that crashed.
pub fn all(seconds: u64) -> Result<()> {
    let seconds = std::env::var("MLX_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seconds);
    let started = Instant::now();
    let bin = build(false, false)?;
    eprintln!(
        "xtask fuzz: built in {:.0?}; {seconds} s per target",
        started.elapsed()
    );
    let mut crashed = Vec::new();
    for t in targets(&bin)? {
        let args = [format!("-max_total_time={seconds}")];
        let (ok, summary) = fuzz(&bin, &t, &args, true)?;
        eprintln!("xtask fuzz: {t}: {summary}");
        if !ok {
            crashed.push(t);
        }
    }
    eprintln!(
        "xtask fuzz: every target run, {:.0?} in all",
        started.elapsed()
    );
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {} (inputs in fuzz/artifacts/; reproduce with \
             `cargo xtask fuzz repro <target> <file>`)",
            crashed.join(", ")
        );
    }
    Ok(())
}

/// The host's target triple (the coverage flags must not reach build
/// scripts and proc macros, so the build names its target).
fn host() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .current_dir(root())
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV names no host")
}

/// Builds `mlx-fuzz` (profile `fuzz`, into `fuzz/target/<kind>`), with
/// AddressSanitizer (nightly) if `asan`, with the dependencies optimised if
/// `optimized`; returns its path.
fn build(asan: bool, optimized: bool) -> Result<PathBuf> {
    let host = host()?;
    let dir = root().join("fuzz");
    let mut flags = COVERAGE_FLAGS.to_string();
    // The cargo that runs xtask is the pinned toolchain's; nightly comes
    // through rustup's proxy.
    let mut cmd = if asan {
        // The standard library is not built with the sanitizer; recent
        // nightlies refuse the mix unless told (as cargo-fuzz tells them).
        flags.push_str(" -Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer");
        let mut c = Command::new("cargo");
        c.arg("+nightly");
        c.env_remove("RUSTC").env_remove("RUSTDOC");
        c
    } else {
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
    };
    let mut kind = if asan { "asan" } else { "stable" }.to_string();
    let mut shown = String::new();
    if optimized {
        kind.push_str("-optimized");
        let deps = "profile.fuzz.package.\"*\".opt-level=1";
        cmd.args(["--config", deps]);
        shown = format!("--config '{deps}' ");
    }
    let target_dir = dir.join("target").join(&kind);
    cmd.args([
        "build",
        "--profile",
        "fuzz",
        "--bin",
        "mlx-fuzz",
        "--target",
    ])
    .arg(&host)
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(&dir)
    .env("RUSTFLAGS", &flags)
    .env_remove("CARGO_ENCODED_RUSTFLAGS")
    .env_remove("CARGO_TARGET_DIR");
    eprintln!(
        "xtask: (in fuzz/) RUSTFLAGS=\"{flags}\" cargo {}{shown}build --profile fuzz --bin mlx-fuzz --target {host} --target-dir {}",
        if asan { "+nightly " } else { "" },
        target_dir.display()
    );
    let status = cmd.status().context("running cargo")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    Ok(target_dir.join(&host).join("fuzz").join("mlx-fuzz"))
}

/// The targets `bin` knows, as it lists them.
fn targets(bin: &Path) -> Result<Vec<String>> {
    let out = Command::new(bin)
        .env("MLX_FUZZ_LIST", "1")
        .output()
        .context("running mlx-fuzz")?;
    if !out.status.success() {
        bail!("mlx-fuzz could not list its targets ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

fn check_target(bin: &Path, target: &str) -> Result<()> {
    let known = targets(bin)?;
    if !known.iter().any(|t| t == target) {
        bail!("no fuzz target {target}; the targets: {}", known.join(", "));
    }
    Ok(())
}

/// An empty scratch folder `fuzz/target/tmp/<name>` (the targets' files
/// go there, through `TMPDIR`).
fn scratch(name: &str) -> Result<PathBuf> {
    let d = root().join("fuzz/target/tmp").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// `bin` set up to run `target`.
fn target_command(bin: &Path, target: &str) -> Result<Command> {
    let mut c = Command::new(bin);
    // libFuzzer writes its logs (`-jobs`: fuzz-<n>.log) where it runs.
    c.current_dir(root().join("fuzz/target"))
        .env("MLX_FUZZ_TARGET", target)
        .env("TMPDIR", scratch(target)?)
        .env_remove("MLX_FUZZ_SEEDS")
        .env_remove("MLX_FUZZ_LIST");
    Ok(c)
}

/// Fuzzes `target` with libFuzzer arguments `args`: its corpus
/// (`fuzz/target/corpus/<target>`, where new inputs go) and the committed
/// seeds; crashes go to `fuzz/artifacts/<target>/`. Returns whether it
/// ended without a crash, and libFuzzer's last status line. `quiet` keeps
/// libFuzzer's output unless it crashed.
fn fuzz(bin: &Path, target: &str, args: &[String], quiet: bool) -> Result<(bool, String)> {
    let fuzz = root().join("fuzz");
    let corpus = fuzz.join("target/corpus").join(target);
    let seeds = fuzz.join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    for d in [&corpus, &seeds, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut prefix = OsString::from("-artifact_prefix=");
    prefix.push(&artifacts);
    prefix.push("/");
    let mut cmd = target_command(bin, target)?;
    cmd.arg(&corpus)
        .arg(&seeds)
        .arg(prefix)
        // A slow input is a finding (a length field that makes a reader
        // loop); so is one that takes gigabytes.
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .args(args);
    if !quiet {
        let status = cmd.status().context("running mlx-fuzz")?;
        return Ok((status.success(), String::new()));
    }
    let out = cmd.output().context("running mlx-fuzz")?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        eprintln!("{text}");
    }
    let runs = text
        .lines()
        .find(|l| l.starts_with("stat::number_of_executed_units:"))
        .and_then(|l| l.rsplit(':').next())
        .map(str::trim)
        .unwrap_or("?");
    let cov = text
        .lines()
        .rev()
        .find(|l| l.contains(" cov: "))
        .and_then(|l| l.split(" cov: ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("?");
    let _ = std::fs::remove_dir_all(fuzz.join("target/tmp").join(target));
    Ok((
        out.status.success(),
        format!("{runs} inputs, coverage {cov} edges"),
    ))
}
