//! `cargo xtask bench collectives`: all_sum and all_gather from 1 KiB to
//! 256 MiB at world 2 and 4 on loopback for every backend (ring, quic, mpi;
//! and `ring-tcp`, the ring with shared memory off, `MLX_DIST_SHM=0`),
//! beside a single-stream TCP copy of the same bytes (the ceiling), then
//! `average_gradients` on the reference Llama's gradient tree against one
//! all_sum per tensor (world 2, ring). The measuring is done by the examples
//! `mlx-dist/examples/collectives_bench.rs` and
//! `mlx-nn/examples/average_gradients_bench.rs` (their `--json` output); this
//! builds them in release, runs one backend and world at a time under a
//! deadline, and writes `collectives.md` and `collectives.json` into the run
//! folder. With `--hosts N` `bench` runs `bench_multihost/` instead, across
//! emulated hosts over shaped links.
//!
//! One file a job: this one holds the options, what a run measured and the
//! entry; `measure.rs` builds and starts the examples and reads what they
//! wrote; `report.rs` checks the goals and writes the table and the JSON.

mod measure;
mod report;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::util::{root, timestamp};

pub(crate) use measure::{build_example, describe, load_average, run_collectives_with};
pub(crate) use report::{human, time};

/// The collectives the example times: the f32 ones, and the bfloat16
/// sums (summed in f32 at each block's owner over more than two ranks).
const OPS: [&str; 5] = [
    "all_sum",
    "all_gather",
    "sum_scatter",
    "all_sum_bf16",
    "sum_scatter_bf16",
];

/// An error naming the first of `ops` that is not one of [`OPS`].
pub(crate) fn check_ops(ops: &[String]) -> Result<()> {
    match ops.iter().find(|op| !OPS.contains(&op.as_str())) {
        Some(op) => bail!("unknown op {op:?}: one of {}", OPS.join(", ")),
        None => Ok(()),
    }
}

/// Options of `cargo xtask bench collectives`.
#[derive(Args, Debug)]
pub struct CollectivesArgs {
    /// Largest message in bytes (sizes are powers of 4 times 1 KiB).
    #[arg(long, default_value_t = 256 << 20)]
    pub max_bytes: u64,
    /// World sizes.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub worlds: Vec<usize>,
    /// Backends: ring, ring-tcp (the ring with shared memory off), tls (the
    /// ring over TLS 1.3), quic, mpi (mpi needs Open MPI's mpirun; skipped
    /// with a reason without it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ring,ring-tcp,tls,quic,mpi"
    )]
    pub backends: Vec<String>,
    /// Collectives to time: all_sum, all_gather, sum_scatter, all_sum_bf16,
    /// sum_scatter_bf16.
    #[arg(long, value_delimiter = ',', default_value = "all_sum,all_gather")]
    pub ops: Vec<String>,
    /// A quick pass: messages up to 1 MiB, one timed average_gradients repetition.
    #[arg(long)]
    pub quick: bool,
    /// Timed repetitions of the average_gradients comparison (median reported).
    #[arg(long, default_value_t = 5)]
    pub avg_iters: usize,
    /// Leave out the average_gradients comparison.
    #[arg(long)]
    pub no_average_gradients: bool,
    /// Deadline of one backend at one world size (or of the average_gradients run), in seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Use the release binaries already built instead of building.
    #[arg(long)]
    pub no_build: bool,
    /// Run folder (default: `runs/bench-collectives-<UTC time>`, or
    /// `runs/bench-multihost-<UTC time>` with `--hosts`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Multi-host mode: bring up this many emulated hosts (network
    /// namespaces with sshd, `cargo xtask hosts`), one rank per host, and
    /// measure over their shaped links at each of `--rates` (backends ring,
    /// quic, mpi, and mlx: MLX's ring from ~/mlx-venv); then fit the
    /// alpha-beta model and project a training step onto more hosts. Needs
    /// root; holds /tmp/mlx-hosts.lock while it runs.
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Link rates of the multi-host mode (tc syntax), each host's link in
    /// each direction.
    #[arg(long, value_delimiter = ',', default_value = "10gbit,1gbit")]
    pub rates: Vec<String>,
    /// Multi-host mode: the per-step compute time at world 1 in ms (the
    /// reference Llama, BENCHMARKS.md) for the projection.
    #[arg(long, default_value_t = 1230.0)]
    pub compute_ms: f64,
    /// Multi-host mode: link rates to project the step onto (tc syntax).
    #[arg(long, value_delimiter = ',', default_value = "1gbit,10gbit,100gbit")]
    pub project_rates: Vec<String>,
    /// Multi-host mode: host counts to project the step onto.
    #[arg(long, value_delimiter = ',', default_value = "8,16,64")]
    pub project_hosts: Vec<usize>,
    /// Multi-host mode without measuring: fit and project again from the
    /// `multihost.json` of this earlier run folder (e.g. with another
    /// `--compute-ms`), rewriting its report.
    #[arg(long)]
    pub from_run: Option<PathBuf>,
}

impl CollectivesArgs {
    pub(crate) fn max_bytes(&self) -> u64 {
        if self.quick {
            self.max_bytes.min(1 << 20)
        } else {
            self.max_bytes
        }
    }

    fn avg_iters(&self) -> usize {
        if self.quick { 1 } else { self.avg_iters }
    }

    /// The command line that reproduces this run.
    pub(crate) fn command_line(&self) -> String {
        let mut s = String::from("cargo xtask bench collectives");
        let default = CollectivesArgs {
            max_bytes: 256 << 20,
            worlds: vec![2, 4],
            backends: ["ring", "ring-tcp", "tls", "quic", "mpi"]
                .map(String::from)
                .to_vec(),
            ops: ["all_sum", "all_gather"].map(String::from).to_vec(),
            quick: false,
            avg_iters: 5,
            no_average_gradients: false,
            timeout: 900,
            no_build: false,
            out: None,
            hosts: None,
            rates: ["10gbit", "1gbit"].map(String::from).to_vec(),
            compute_ms: 1230.0,
            project_rates: ["1gbit", "10gbit", "100gbit"].map(String::from).to_vec(),
            project_hosts: vec![8, 16, 64],
            from_run: None,
        };
        if let Some(d) = &self.from_run {
            let _ = write!(s, " --from-run {}", d.display());
        }
        if let Some(n) = self.hosts {
            let _ = write!(s, " --hosts {n}");
            if self.rates != default.rates {
                let _ = write!(s, " --rates {}", self.rates.join(","));
            }
        }
        if self.max_bytes != default.max_bytes {
            let _ = write!(s, " --max-bytes {}", self.max_bytes);
        }
        let list = |v: &[String]| v.join(",");
        if self.worlds != default.worlds {
            let w: Vec<String> = self.worlds.iter().map(|w| w.to_string()).collect();
            let _ = write!(s, " --worlds {}", list(&w));
        }
        if self.backends != default.backends {
            let _ = write!(s, " --backends {}", list(&self.backends));
        }
        if self.ops != default.ops {
            let _ = write!(s, " --ops {}", list(&self.ops));
        }
        if self.quick {
            s.push_str(" --quick");
        }
        if self.avg_iters != default.avg_iters {
            let _ = write!(s, " --avg-iters {}", self.avg_iters);
        }
        if self.no_average_gradients && self.hosts.is_none() {
            s.push_str(" --no-average-gradients");
        }
        if self.hosts.is_some() || self.from_run.is_some() {
            if self.compute_ms != default.compute_ms {
                let _ = write!(s, " --compute-ms {}", self.compute_ms);
            }
            if self.project_rates != default.project_rates {
                let _ = write!(s, " --project-rates {}", self.project_rates.join(","));
            }
            if self.project_hosts != default.project_hosts {
                let h: Vec<String> = self.project_hosts.iter().map(|h| h.to_string()).collect();
                let _ = write!(s, " --project-hosts {}", h.join(","));
            }
        }
        s
    }
}

/// One backend at one world size.
pub(crate) struct Run {
    pub backend: String,
    pub world: usize,
    /// "ok", "failed" or "skipped".
    pub status: String,
    pub reason: Option<String>,
    pub wall_s: f64,
    /// The TCP copy's GB/s per size, measured just before this run.
    pub ceiling: Vec<(u64, f64)>,
    pub rows: Vec<Row>,
}

/// One collective at one message size.
pub(crate) struct Row {
    pub op: String,
    pub bytes: u64,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub ceiling: f64,
    pub ratio: f64,
}

/// What one run measured: every backend at every world size, the
/// average_gradients comparison (unless left out), and the load average
/// before and after.
pub(crate) struct Measured {
    pub runs: Vec<Run>,
    pub avg: Option<Result<Value>>,
    pub load: (Option<String>, Option<String>),
}

/// Runs the benchmark on this machine and writes the run folder (`bench`
/// hands runs with `--hosts` or `--from-run` to `bench_multihost`, which
/// builds on this module).
pub fn run(a: CollectivesArgs) -> Result<()> {
    if a.worlds.is_empty() || a.worlds.iter().any(|&w| w < 2) {
        bail!("--worlds needs world sizes of at least 2, e.g. 2,4");
    }
    if a.max_bytes() < 1024 {
        bail!("--max-bytes must be at least 1024 (the smallest message)");
    }
    for b in &a.backends {
        if !["ring", "ring-tcp", "tls", "quic", "mpi"].contains(&b.as_str()) {
            bail!("unknown backend {b:?}: ring, ring-tcp, tls, quic or mpi");
        }
    }
    check_ops(&a.ops)?;
    let out = a.out.clone().unwrap_or_else(|| {
        root()
            .join("runs")
            .join(format!("bench-collectives-{}", timestamp()))
    });
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let measured = measure::measure(&a, &out)?;
    report::write(&a, &out, &measured)
}

impl Run {
    pub(crate) fn skipped(backend: &str, reason: &str) -> Run {
        Run {
            backend: backend.into(),
            world: 0,
            status: "skipped".into(),
            reason: Some(reason.into()),
            wall_s: 0.0,
            ceiling: vec![],
            rows: vec![],
        }
    }
}
