//! Test support, built only with feature `test-hooks` (the crate's tests
//! turn it on; a release build has none of it): a rank that kills itself
//! with SIGKILL at a chosen step, so that the restart tests
//! (`tests/restart.rs`) can fail a run as a crash would, at a step they
//! chose and can replay.
//!
//! `MLX_TEST_KILL_AT=RANK:STEP` makes rank RANK kill itself right after
//! step STEP's metrics are written, before that step's checkpoint, on the
//! job's first attempt only (`MLX_RESTART_COUNT` 0), so that the restarted
//! job runs through. `RANK:STEP:publish` kills it instead in the middle of
//! publishing step STEP's checkpoint: its folder renamed into place, the
//! `latest` pointer not yet moved to it. Unset, it costs one environment
//! lookup per run.

use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Environment variable: `RANK:STEP` or `RANK:STEP:publish`, the rank to
/// kill, after which step, and where.
pub const ENV_TEST_KILL_AT: &str = "MLX_TEST_KILL_AT";

/// Where [`ENV_TEST_KILL_AT`] kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// After the step's metrics, before its checkpoint.
    AfterStep,
    /// Between renaming the checkpoint's folder and moving `latest`.
    Publish,
}

/// The rank, step and phase to kill at.
type Target = (usize, u64, Phase);

/// The rank, step and phase of [`ENV_TEST_KILL_AT`], parsed once; `None`
/// when unset or on a restarted attempt.
fn target() -> Result<Option<Target>> {
    static TARGET: OnceLock<Result<Option<Target>, String>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let Ok(v) = std::env::var(ENV_TEST_KILL_AT) else {
                return Ok(None);
            };
            if mlx_dist::config::restart_count().map_err(|e| e.to_string())? > 0 {
                return Ok(None);
            }
            let parts: Vec<&str> = v.split(':').map(str::trim).collect();
            let phase = match parts.get(2) {
                None => Some(Phase::AfterStep),
                Some(&"publish") => Some(Phase::Publish),
                Some(_) => None,
            };
            let parsed = match (parts.len(), phase) {
                (2 | 3, Some(phase)) => parts[0]
                    .parse()
                    .ok()
                    .zip(parts[1].parse().ok())
                    .map(|(r, s)| (r, s, phase)),
                _ => None,
            };
            parsed.map(Some).ok_or_else(|| {
                format!("{ENV_TEST_KILL_AT}={v:?} is not RANK:STEP or RANK:STEP:publish")
            })
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Whether [`die_if_asked`] kills rank `rank` after step `done`.
pub(super) fn asked(rank: usize, done: u64) -> Result<bool> {
    Ok(target()? == Some((rank, done, Phase::AfterStep)))
}

/// Kills this process with SIGKILL when it is rank `rank` and has just
/// done step `done` as [`ENV_TEST_KILL_AT`] asks; returns otherwise.
pub(super) fn die_if_asked(rank: usize, done: u64) -> Result<()> {
    if !asked(rank, done)? {
        return Ok(());
    }
    die(rank, done)
}

/// Kills this process with SIGKILL when it is rank `rank` publishing the
/// checkpoint of step `step` as [`ENV_TEST_KILL_AT`] asks (`:publish`).
pub(super) fn die_in_publish_if_asked(rank: usize, step: u64) -> Result<()> {
    if target()? != Some((rank, step, Phase::Publish)) {
        return Ok(());
    }
    die(rank, step)
}

fn die(rank: usize, done: u64) -> Result<()> {
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
