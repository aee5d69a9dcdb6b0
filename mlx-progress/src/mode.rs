//! The way a process shows progress, chosen once from `MLX_PROGRESS`.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that chooses the [`Mode`].
pub const ENV_MODE: &str = "MLX_PROGRESS";

/// The environment variable that sets the seconds between two plain lines
/// of one task (default 5).
pub const ENV_INTERVAL: &str = "MLX_PROGRESS_INTERVAL";

/// The seconds between two plain lines of one task when [`ENV_INTERVAL`] is unset.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bars drawn on the terminal (indicatif), with rate and ETA.
    Bar,
    /// Parseable `progress task=.. done=..` lines without ANSI, a few seconds apart.
    Plain,
    /// Marked JSON lines on stderr for a launcher to render (see [`crate::Event`]).
    Events,
    /// Nothing.
    Off,
}

impl Mode {
    /// The mode a `MLX_PROGRESS` value names (`bar`, `plain`, `events`, `off`; any case).
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bar" => Some(Mode::Bar),
            "plain" => Some(Mode::Plain),
            "events" => Some(Mode::Events),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }

    /// The mode `value` (of `MLX_PROGRESS`) asks for, else [`Mode::Bar`] when
    /// stderr is a terminal and [`Mode::Plain`] otherwise; the error names a
    /// value that is not a mode.
    pub fn choose(value: Option<&str>, stderr_is_terminal: bool) -> Result<Mode, String> {
        let fallback = if stderr_is_terminal {
            Mode::Bar
        } else {
            Mode::Plain
        };
        match value {
            None | Some("") => Ok(fallback),
            Some(v) => Mode::parse(v).ok_or_else(|| {
                format!(
                    "{ENV_MODE}={v:?} is not one of bar, plain, events, off; showing progress as {fallback:?}"
                )
            }),
        }
    }
}

/// This process's mode: chosen on first use from [`ENV_MODE`] and whether
/// stderr is a terminal, then fixed.
pub fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let value = std::env::var(ENV_MODE).ok();
        let tty = std::io::stderr().is_terminal();
        Mode::choose(value.as_deref(), tty).unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            Mode::choose(None, tty).expect("no value is always a mode")
        })
    })
}

/// The least time between two plain lines of one task: [`ENV_INTERVAL`]
/// seconds (fractions allowed), else [`DEFAULT_INTERVAL`].
pub fn plain_interval() -> Duration {
    static INTERVAL: OnceLock<Duration> = OnceLock::new();
    *INTERVAL.get_or_init(|| {
        std::env::var(ENV_INTERVAL)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(DEFAULT_INTERVAL, Duration::from_secs_f64)
    })
}

/// Whether log lines on stderr should carry ANSI colours: stderr is a
/// terminal and `NO_COLOR` is unset or empty (<https://no-color.org>).
pub fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_and_the_terminal_decides_otherwise() {
        assert_eq!(Mode::choose(Some("events"), true), Ok(Mode::Events));
        assert_eq!(Mode::choose(Some(" OFF "), false), Ok(Mode::Off));
        assert_eq!(Mode::choose(Some("bar"), false), Ok(Mode::Bar));
        assert_eq!(Mode::choose(None, true), Ok(Mode::Bar));
        assert_eq!(Mode::choose(Some(""), false), Ok(Mode::Plain));
        let e = Mode::choose(Some("fancy"), false).unwrap_err();
        assert!(e.contains("\"fancy\"") && e.contains("Plain"), "{e}");
    }
}
