//! A whole world inside one process: each rank on its own thread, connected
//! over loopback TCP exactly as separate processes would be. For testing
//! distributed code without a launcher.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::collectives::comm::MeshComm;
use crate::mesh::Mesh;
use crate::transports::tcp;
use crate::{Config, DistError, Group, Result};

/// Runs `f` on `n` ranks (threads) of a fresh ring world and returns each
/// rank's result, in rank order. A rank that fails to connect or panics
/// makes the whole call an error.
///
/// ```
/// use mlx_array::{Array, Dtype};
/// let sums = mlx_dist::run_local(2, |g| {
///     let x = Array::full(&[3], (g.rank() + 1) as f64, Dtype::F32);
///     mlx_dist::all_sum(&x, &g).unwrap().to_vec::<f32>().unwrap()
/// })
/// .unwrap();
/// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
/// ```
pub fn run_local<T: Send>(n: usize, f: impl Fn(Group) -> T + Sync) -> Result<Vec<T>> {
    run_local_with(n, |_| {}, f)
}

/// [`run_local`] with each rank's [`Config`] adjusted by `configure` (shorter
/// timeouts for tests whose failures should not wait ten minutes).
pub(crate) fn run_local_with<T: Send>(
    n: usize,
    configure: impl Fn(&mut Config) + Sync,
    f: impl Fn(Group) -> T + Sync,
) -> Result<Vec<T>> {
    if n == 1 {
        return Ok(vec![f(Group::single())]);
    }
    let io = |e: std::io::Error| DistError::InvalidArgument {
        op: "run_local",
        msg: format!("cannot bind a loopback port: {e}"),
    };
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    let hosts: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.to_string()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    let mut secret = vec![0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| DistError::InvalidArgument {
        op: "run_local",
        msg: format!("no randomness: {e}"),
    })?;
    std::thread::scope(|s| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let mut cfg = Config::new(r, hosts.clone(), [7; 16], secret.clone());
                cfg.connect_timeout = Duration::from_secs(30);
                configure(&mut cfg);
                let f = &f;
                s.spawn(move || -> Result<T> {
                    let mesh = Mesh::new(&cfg, tcp::connect_mesh(&cfg, l, false)?);
                    Ok(f(Group::from_impl(Arc::new(MeshComm::world(
                        mesh, "ring",
                    )?))))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(DistError::InvalidArgument {
                        op: "run_local",
                        msg: format!("rank {r} panicked"),
                    })
                })
            })
            .collect()
    })
}
