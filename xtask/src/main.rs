//! Developer and experiment entry points: `cargo xtask test`, `cargo xtask train`, ...

mod alpha_beta;
mod bench;
mod bench_collectives;
mod bench_multihost;
mod fuzz;
mod hosts;
mod hosts_lock;
mod layers;
mod macos_check;
mod memprof;
mod report_common;
mod test;
mod train;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Developer and experiment tasks for the mlx-rs workspace"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// The whole suite: the layering check, fmt check, clippy with -D warnings, every test.
    Test,
    /// The layering check: every crate's imports against its table in
    /// `layers.toml` (layers, forbidden imports, allowed circles).
    Layers(layers::Args),
    /// Build in release and train the Llama on N ranks through mlx-launch.
    Train(train::TrainArgs),
    /// The experiment at several world sizes with the memory of every process
    /// polled ~10 times a second: CSV, Markdown table and PNG chart.
    Memprof(memprof::Args),
    /// Benchmarks: `bench train` (tokens/s, ms/step and scaling efficiency),
    /// `bench collectives` (all_sum/all_gather bandwidth per backend, average_gradients).
    Bench {
        #[command(subcommand)]
        what: bench::What,
    },
    /// The coverage-guided fuzz targets (fuzz/): `fuzz list`, `fuzz run
    /// TARGET [--seconds N] [-- libFuzzer args]`, `fuzz repro TARGET FILE`,
    /// `fuzz all` (each target a few seconds, as `xtask test` runs them),
    /// `fuzz seeds` (rewrites the committed seeds).
    Fuzz {
        #[command(subcommand)]
        what: fuzz::Cmd,
    },
    /// Emulated hosts on this Linux machine (network namespaces with sshd,
    /// optionally rate-shaped links) for multi-host tests: `hosts up N`,
    /// `hosts down`, `hosts shape RATE`, `hosts status`.
    Hosts {
        #[command(subcommand)]
        what: hosts::Cmd,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Test => test::run(),
        Task::Layers(a) => layers::run(a),
        Task::Train(a) => train::run(a),
        Task::Memprof(a) => memprof::run(a),
        Task::Bench { what } => bench::run(what),
        Task::Fuzz { what } => fuzz::run(what),
        Task::Hosts { what } => hosts::run(what),
    }
}
