//! Restart on failure (`mlx-launch --max-restarts K`), as torchrun's
//! `--max-restarts`: when a rank fails, [`run`](super::run) has already
//! stopped the others; the whole job is then started again, up to K times,
//! after a backoff that doubles from [`Restarts::backoff`] up to
//! [`Restarts::max_backoff`].
//!
//! Every attempt is a launch of its own: a fresh job id and secret, ports
//! chosen again (free ones for local jobs; the same `--starting-port` ports,
//! which the dead attempt's ranks no longer hold, for remote ones), new host
//! and report files. The ranks learn which attempt they are from
//! `MLX_RESTART_COUNT` (0, then 1, ...), so that a trainer can resume from
//! its last checkpoint. An interrupted job (Ctrl-C, SIGTERM, SIGHUP to the
//! launcher, also during a backoff) is never restarted: the user asked it to
//! stop.

use std::sync::mpsc;
use std::time::Duration;

use super::supervise::{Event, forward_interrupts, interrupts_seen, last_interrupt};
use super::{LaunchOutcome, LaunchSpec};

/// How often and how patiently a failed job is started again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restarts {
    /// How many times the job may be restarted (0: never, as without the option).
    pub max_restarts: u32,
    /// The wait before the first restart; it doubles for each further one.
    pub backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for Restarts {
    /// No restart; a backoff of 1 s, doubling up to 30 s, once restarts are asked for.
    fn default() -> Restarts {
        Restarts {
            max_restarts: 0,
            backoff: DEFAULT_BACKOFF,
            max_backoff: MAX_BACKOFF,
        }
    }
}

/// The default wait before the first restart.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// The default cap of the doubling wait.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Restarts {
    /// The wait before restart `i` (1-based): `backoff * 2^(i-1)`, at most `max_backoff`.
    pub fn delay(&self, i: u32) -> Duration {
        let factor = 1u32.checked_shl(i.saturating_sub(1)).unwrap_or(u32::MAX);
        self.backoff
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_backoff.max(self.backoff))
    }
}

/// How a launch with restarts ended.
#[derive(Debug)]
pub struct RestartsOutcome {
    /// The last attempt's outcome.
    pub last: LaunchOutcome,
    /// How many times the job was restarted.
    pub restarts: u32,
    /// Whether the user interrupted the launcher while it waited to restart.
    pub interrupted_in_backoff: bool,
}

impl RestartsOutcome {
    /// The launcher's exit code: the last attempt's (0 when it succeeded,
    /// else the failed rank's code), or 128 + the signal when interrupted
    /// during a backoff (130 for Ctrl-C, 143 for SIGTERM).
    pub fn exit_code(&self) -> i32 {
        if self.interrupted_in_backoff {
            128 + last_interrupt().unwrap_or(libc::SIGINT)
        } else {
            self.last.exit_code()
        }
    }

    /// The line that says why the launch finally failed, if it did.
    pub fn report(&self) -> Option<String> {
        let line = self.last.report()?;
        Some(match (self.interrupted_in_backoff, self.restarts) {
            (true, _) => format!("{line}; interrupted before restarting"),
            (false, 0) => line,
            (false, n) => format!(
                "{line} (after {n} restart{})",
                if n == 1 { "" } else { "s" }
            ),
        })
    }
}

/// Whether an attempt that ended as `o` is worth starting again: it failed,
/// and not because the user interrupted it.
fn should_restart(o: &LaunchOutcome) -> bool {
    !o.interrupted && o.exit_code() != 0
}

/// The line printed before restart `i` of `max`: which rank failed how,
/// the attempt, and the wait.
pub fn restart_line(failure: &str, i: u32, max: u32, wait: Duration) -> String {
    format!(
        "{failure}; restarting the job (restart {i} of {max}) in {:.1}s",
        wait.as_secs_f64()
    )
}

/// Runs `spec` (as [`super::run`]) and starts it again after each failure,
/// up to `policy.max_restarts` times, telling each attempt its number
/// (`MLX_RESTART_COUNT`). `say` receives the line announcing each restart
/// (`mlx-launch` prints it on stderr). A launch that cannot start its ranks
/// is an error at once, not restarted.
pub fn run_with_restarts(
    spec: &LaunchSpec,
    policy: &Restarts,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<RestartsOutcome> {
    let mut spec = spec.clone();
    let mut restarts = 0;
    loop {
        spec.restart_count = restarts;
        let seen = interrupts_seen();
        let mut last = super::run(&spec)?;
        // An interrupt the attempt did not forward (it came while the
        // launcher was cleaning up) still means: stop.
        if interrupts_seen() != seen {
            last.interrupted = true;
            last.interrupt_signal = last.interrupt_signal.or(last_interrupt());
        }
        if restarts >= policy.max_restarts || !should_restart(&last) {
            return Ok(RestartsOutcome {
                last,
                restarts,
                interrupted_in_backoff: false,
            });
        }
        restarts += 1;
        let wait = policy.delay(restarts);
        let failure = last
            .report()
            .unwrap_or_else(|| format!("the job failed (exit status {})", last.exit_code()));
        say(&restart_line(&failure, restarts, policy.max_restarts, wait));
        if interrupted_within(wait) || interrupts_seen() != seen {
            return Ok(RestartsOutcome {
                last,
                restarts: restarts - 1,
                interrupted_in_backoff: true,
            });
        }
    }
}

/// Waits `wait`, returning early with `true` when the user interrupts the launcher.
fn interrupted_within(wait: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    forward_interrupts(Some(tx));
    let r = rx.recv_timeout(wait);
    forward_interrupts(None);
    matches!(r, Ok(Event::Interrupt(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let p = Restarts {
            max_restarts: 10,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(3),
        };
        let got: Vec<u128> = (1..=6).map(|i| p.delay(i).as_millis()).collect();
        assert_eq!(got, [500, 1000, 2000, 3000, 3000, 3000]);
        assert_eq!(p.delay(200), Duration::from_secs(3), "no overflow");
        let zero = Restarts {
            backoff: Duration::ZERO,
            ..p
        };
        assert_eq!(zero.delay(5), Duration::ZERO);
    }

    #[test]
    fn the_restart_line_names_the_failure_the_attempt_and_the_wait() {
        let line = restart_line(
            "rank 1 failed (killed by signal 9)",
            1,
            3,
            Duration::from_secs(2),
        );
        assert_eq!(
            line,
            "rank 1 failed (killed by signal 9); restarting the job (restart 1 of 3) in 2.0s"
        );
    }
}
