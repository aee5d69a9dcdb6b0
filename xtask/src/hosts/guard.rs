//! [`HostsGuard`]: hosts that come down when it is dropped.

use std::ops::Deref;

use anyhow::Result;

use super::down::down;
use super::running::Hosts;
use super::up::up;

/// Hosts that are brought down when this is dropped, so a test or benchmark
/// that fails or panics still leaves nothing behind.
#[allow(dead_code)] // Library API for tests and benchmarks.
pub struct HostsGuard(pub Hosts);

#[allow(dead_code)] // Library API for tests and benchmarks.
impl HostsGuard {
    /// [`up`] with `n` hosts, guarded.
    pub fn up(n: usize, rate: Option<&str>) -> Result<HostsGuard> {
        up(n, rate).map(HostsGuard)
    }
}

impl Deref for HostsGuard {
    type Target = Hosts;
    fn deref(&self) -> &Hosts {
        &self.0
    }
}

impl Drop for HostsGuard {
    fn drop(&mut self) {
        if let Err(e) = down() {
            eprintln!("xtask hosts: bringing the hosts down failed: {e:#}");
        }
    }
}
