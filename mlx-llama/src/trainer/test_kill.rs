//! Test support, not a feature: a rank that kills itself with SIGKILL at a
//! chosen step, so that the restart tests (`tests/restart.rs`) can fail a
//! run as a crash would, at a step they chose and can replay.
//!
//! `MLX_TEST_KILL_AT=RANK:STEP` makes rank RANK kill itself right after
//! step STEP's metrics are written, before that step's checkpoint, on the
//! job's first attempt only (`MLX_RESTART_COUNT` 0), so that the restarted
//! job runs through. Unset, it costs one environment lookup per run.

use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Environment variable: `RANK:STEP`, the rank to kill and after which step.
pub const ENV_TEST_KILL_AT: &str = "MLX_TEST_KILL_AT";

/// The rank and step of [`ENV_TEST_KILL_AT`], parsed once; `None` when unset
/// or on a restarted attempt.
fn target() -> Result<Option<(usize, u64)>> {
    static TARGET: OnceLock<Result<Option<(usize, u64)>, String>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let Ok(v) = std::env::var(ENV_TEST_KILL_AT) else {
                return Ok(None);
            };
            if mlx_dist::config::restart_count().map_err(|e| e.to_string())? > 0 {
                return Ok(None);
            }
            let parsed = v
                .split_once(':')
                .and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
            parsed
                .map(Some)
                .ok_or_else(|| format!("{ENV_TEST_KILL_AT}={v:?} is not RANK:STEP"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Kills this process with SIGKILL when it is rank `rank` and has just
/// done step `done` as [`ENV_TEST_KILL_AT`] asks; returns otherwise.
pub(super) fn die_if_asked(rank: usize, done: u64) -> Result<()> {
    if target()? != Some((rank, done)) {
        return Ok(());
    }
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    eprintln!(
        "{ENV_TEST_KILL_AT}: rank {rank} kills itself (SIGKILL) after step {done} at unix_ms={unix_ms}"
    );
    let pid = std::process::id().to_string();
    std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .context("running kill -KILL on this rank")?;
    // The signal is on its way; nothing of this rank may run on meanwhile.
    std::thread::sleep(std::time::Duration::from_secs(60));
    bail!("{ENV_TEST_KILL_AT}: rank {rank} survived its SIGKILL")
}
