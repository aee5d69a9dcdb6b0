//! The transports: how bytes get from one rank to another. A [`link::Link`]
//! is one connection (TCP, TCP through shared memory between ranks on one
//! host, TLS 1.3 over TCP, a QUIC stream); `tcp` and `quic` connect every
//! pair of ranks ([`Connections`]) after the job's `handshake`; `mpi` hands
//! the whole job to MPI instead.
//!
//! Layering: transports know the configuration and the frame layout
//! ([`crate::wire`]), never the mesh built over their connections, the
//! collectives or the launcher (checked by `cargo xtask layers`, from the
//! table in `layers.toml`).

pub(crate) mod admission;
pub mod handshake;
pub(crate) mod link;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg(feature = "quic")]
pub mod quic;
#[cfg(feature = "quic")]
pub(crate) mod quic_link;
pub(crate) mod shm;
pub(crate) mod tcp;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tls")]
pub(crate) mod tls_link;

use link::Link;

/// One rank's connections to every peer, as links: `links[peer]` the data
/// links to `peer`, `witnesses[peer]` its liveness channel (both empty for
/// this rank itself). The mesh is built from them (`crate::mesh::Mesh::new`).
pub(crate) struct Connections {
    /// The data links to each peer.
    pub links: Vec<Vec<Box<dyn Link>>>,
    /// The liveness channel ("witness") to each peer.
    pub witnesses: Vec<Option<Box<dyn Link>>>,
}
