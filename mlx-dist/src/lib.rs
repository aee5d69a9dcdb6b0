//! Distributed communication for data-parallel training, in the style of
//! MLX's `mx.distributed`: a [`Group`] of ranks, collectives as primitives of
//! `mlx-array`'s lazy graph ([`all_sum`], [`all_gather`], [`sum_scatter`],
//! [`send`]/[`recv`], ...), the transports that carry them (a pipelined ring
//! over TCP, whose large payloads go through shared memory between ranks on
//! one host; the ring over TLS 1.3, feature `tls`; QUIC, feature `quic`;
//! both on by default; MPI, feature `mpi`) and the `mlx-launch` binary that
//! starts the ranks (feature `launcher`, on by default; the layers above
//! depend on this crate without it).
//!
//! The classic first program; with no launcher the world is a group of one
//! and `all_sum` is the identity:
//!
//! ```
//! use mlx_array::{Array, Dtype};
//! use mlx_dist::{all_sum, init, Backend};
//!
//! let world = init(Backend::Any)?;                             // size 1 without a launcher
//! let x = all_sum(&Array::ones(&[10], Dtype::F32), &world)?;  // a node of the graph
//! let v: Vec<f32> = x.to_vec()?;                               // evaluates it
//! assert!(v.iter().all(|&s| s == world.size() as f32));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Group`] also has the same collectives on plain slices
//! (`world.all_sum(&mut vec)`), for code outside the graph.
//!
//! Run it on 4 processes with `mlx-launch -n 4 -- target/debug/examples/all_sum`.
//! How the launcher configures ranks is described in [`config`]; the frame
//! layout in [`wire`]; the connection handshake in [`handshake`].
//!
//! Under Slurm, `srun -n 4 target/debug/examples/all_sum` works too, without
//! `mlx-launch`: a task of an srun step with no `MLX_RANK` takes its rank
//! from `SLURM_PROCID` and the ranks' addresses from the step's node list
//! and tasks per node, assuming srun's default block distribution (another
//! `SLURM_DISTRIBUTION` that would place ranks differently is an error).
//! Rank `r` listens on `<its node's name>:<port>`, the port being its
//! task's share of `srun --resv-ports` (`SLURM_STEP_RESV_PORTS`), else
//! `MLX_DIST_PORT` plus its index on the node, else one derived from the
//! job and step ids; node names must resolve to the fast network's
//! interface, or set `MLX_DIST_HOSTS` yourself. Export
//! `MLX_DIST_JOB_SECRET` (srun passes it on) for authenticated
//! connections; every other variable of [`config`] applies as usual. With
//! `MLX_DIST_BACKEND=mpi` (or a build with feature `mpi` under
//! `srun --mpi=pmix` and no `MLX_DIST_BACKEND`) the world is MPI's.
//!
//! Failures are errors that name the rank at fault, never hangs: every rank
//! heartbeats to every peer from a thread of its own, so a peer that dies or
//! falls silent is reported after the liveness timeout (5 s), while a live
//! peer that is merely busy is waited for up to the collective timeout (ten
//! minutes); both are set per world with [`init_with`] and [`InitOptions`],
//! or by the environment ([`config`]).
//!
//! The source, from the bottom layer up (each imports only its own layer
//! and those below; `cargo xtask layers` checks it against `layers.toml`):
//! - [`error`], [`wire`] (the frame layout), [`reduce`], [`report`] and
//!   [`group`] (the handle every backend implements): leaves;
//! - [`config`]: the environment, host files and Slurm's variables;
//! - `transports/`: one connection as a link (TCP, TCP with shared memory on
//!   one host, TLS, QUIC), the [`handshake`], connecting every pair of ranks,
//!   and MPI;
//! - `mesh/`: the connected mesh, each peer's liveness and the threads that
//!   keep it;
//! - [`collectives`]: the graph primitives and the algorithms over the mesh
//!   (ring, owner-computes);
//! - [`launch`]: the launcher;
//! - this file and `local.rs`: joining a job, wiring the layers together.

pub mod collectives;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod group;
pub mod launch;
mod local;
mod mesh;
pub mod reduce;
pub mod report;
pub mod stats;
mod transports;
pub mod wire;

pub use transports::handshake;
#[cfg(feature = "quic")]
pub use transports::quic;
#[cfg(feature = "tls")]
pub use transports::tls;

pub use collectives::{
    all_gather, all_max, all_min, all_sum, mean_scatter, recv, recv_like, send, sum_gradients,
    sum_partials, sum_scatter,
};
pub use config::{Backend, Config, QuicCert};
pub use error::{DistError, Result};
pub use group::Group;
pub use local::run_local;
pub use reduce::ReduceOp;

/// The conformance specifications of the collectives (feature
/// `conformance`), for `mlx_array::conformance::main`: each runs in real
/// worlds of 1, 2 and 3 ranks (threads over loopback TCP) against an f64
/// reference computed from every rank's inputs.
#[cfg(feature = "conformance")]
pub fn conformance_specs() -> Vec<mlx_array::conformance::Spec> {
    collectives::spec::specs()
}

/// Whether `backend` can be used by this build on this machine.
pub fn is_available(backend: Backend) -> bool {
    match backend {
        Backend::Any | Backend::Ring => true,
        Backend::Quic => cfg!(feature = "quic"),
        Backend::Tls => cfg!(feature = "tls"),
        Backend::Mpi => cfg!(feature = "mpi"),
    }
}

/// Ends this rank's process with `code`, as `std::process::exit` does; under
/// the MPI backend a non-zero code first aborts the whole job
/// (`MPI_Abort`), so that the other ranks, waiting for this one in a
/// collective, end too instead of hanging. A program's top level calls it
/// on its error path (on glibc, a plain `exit` with a failure does the same).
pub fn exit_rank(code: i32) -> ! {
    #[cfg(feature = "mpi")]
    if code != 0 {
        transports::mpi::abort_job(code);
    }
    std::process::exit(code)
}

/// Joins the job described by the launcher's environment (see [`config`]),
/// or returns a group of one when there is none.
///
/// With `Backend::Mpi`, or `Backend::Any` in a process started by `mpirun`
/// (Open MPI's `OMPI_COMM_WORLD_*`, PMI/PMIx variables) and no `mlx-launch`
/// environment, the world is MPI's (feature `mpi`).
pub fn init(backend: Backend) -> Result<Group> {
    init_with(&InitOptions::new(backend))
}

/// How to join a job: the backend, and timeouts that override the
/// environment's (`MLX_DIST_TIMEOUT_MS`, `MLX_DIST_LIVENESS_MS`) for the
/// world group and every group split from it.
///
/// ```
/// use std::time::Duration;
/// use mlx_dist::{init_with, Backend, InitOptions};
///
/// // A rank that may spend 30 minutes alone in an evaluation before the
/// // next collective, and whose peers are declared dead after 10 s of silence.
/// let world = init_with(
///     &InitOptions::new(Backend::Any)
///         .collective_timeout(Duration::from_secs(1800))
///         .liveness_timeout(Duration::from_secs(10)),
/// )?;
/// assert_eq!(world.size(), 1); // no launcher here
/// # Ok::<(), mlx_dist::DistError>(())
/// ```
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The transport.
    pub backend: Backend,
    /// How long a live peer that is late to a collective is waited for
    /// (default: the environment's, else ten minutes).
    pub collective_timeout: Option<std::time::Duration>,
    /// How long a peer may send no heartbeat before it is declared dead
    /// (default: the environment's, else 5 s).
    pub liveness_timeout: Option<std::time::Duration>,
}

impl InitOptions {
    /// Options for `backend`, every timeout from the environment or its default.
    pub fn new(backend: Backend) -> InitOptions {
        InitOptions {
            backend,
            collective_timeout: None,
            liveness_timeout: None,
        }
    }

    /// Sets the collective timeout.
    pub fn collective_timeout(mut self, t: std::time::Duration) -> InitOptions {
        self.collective_timeout = Some(t);
        self
    }

    /// Sets the liveness timeout.
    pub fn liveness_timeout(mut self, t: std::time::Duration) -> InitOptions {
        self.liveness_timeout = Some(t);
        self
    }
}

/// [`init`] with explicit options.
pub fn init_with(opts: &InitOptions) -> Result<Group> {
    let backend = opts.backend;
    for t in [opts.collective_timeout, opts.liveness_timeout]
        .into_iter()
        .flatten()
    {
        if t.is_zero() {
            return Err(DistError::InvalidArgument {
                op: "init",
                msg: "a timeout must be longer than zero".into(),
            });
        }
    }
    let env = Config::from_env()?;
    if env.is_some() {
        // Started by mlx-launch: die with it, even if it is killed.
        launch::watch_parent();
    }
    if backend == Backend::Mpi || (backend == Backend::Any && env.is_none() && launched_by_mpi()) {
        return init_mpi();
    }
    match env {
        None => Ok(Group::single()),
        Some((mut cfg, env_backend)) => {
            let chosen = match backend {
                Backend::Any => env_backend.unwrap_or(Backend::Ring),
                b => b,
            };
            if let Some(t) = opts.collective_timeout {
                cfg.collective_timeout = t;
            }
            if let Some(t) = opts.liveness_timeout {
                cfg.liveness_timeout = t;
            }
            init_with_config(&cfg, chosen)
        }
    }
}

#[cfg(feature = "mpi")]
fn launched_by_mpi() -> bool {
    transports::mpi::launched_by_mpi()
}

#[cfg(not(feature = "mpi"))]
fn launched_by_mpi() -> bool {
    false
}

#[cfg(feature = "mpi")]
fn init_mpi() -> Result<Group> {
    transports::mpi::world()
}

#[cfg(not(feature = "mpi"))]
fn init_mpi() -> Result<Group> {
    Err(DistError::Unavailable {
        backend: "mpi",
        reason: "this build has no MPI support (build mlx-dist with `--features mpi`)".into(),
    })
}

/// Joins the job described by `cfg` over `backend` (for tests and tools that
/// configure ranks themselves). Blocks until every peer is connected.
pub fn init_with_config(cfg: &Config, backend: Backend) -> Result<Group> {
    if cfg.world() == 1 {
        return Ok(Group::single());
    }
    match backend {
        Backend::Any | Backend::Ring => {
            let listener = transports::tcp::bind(cfg)?;
            let mesh = mesh::Mesh::new(cfg, transports::tcp::connect_mesh(cfg, listener, false)?);
            Ok(Group::from_impl(std::sync::Arc::new(
                collectives::comm::MeshComm::world(mesh, "ring")?,
            )))
        }
        #[cfg(feature = "tls")]
        Backend::Tls => {
            let listener = transports::tcp::bind(cfg)?;
            let mesh = mesh::Mesh::new(cfg, transports::tcp::connect_mesh(cfg, listener, true)?);
            Ok(Group::from_impl(std::sync::Arc::new(
                collectives::comm::MeshComm::world(mesh, "tls")?,
            )))
        }
        #[cfg(feature = "quic")]
        Backend::Quic => {
            let mesh = mesh::Mesh::new(cfg, transports::quic::connect_mesh(cfg)?);
            Ok(Group::from_impl(std::sync::Arc::new(
                collectives::comm::MeshComm::world(mesh, "quic")?,
            )))
        }
        Backend::Mpi => init_mpi(),
        #[allow(unreachable_patterns)]
        b => Err(DistError::Unavailable {
            backend: b.name(),
            reason: "not compiled into this build".into(),
        }),
    }
}

#[cfg(test)]
mod inproc_tests;
#[cfg(test)]
mod mutation;
