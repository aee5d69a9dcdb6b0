//! The ranks' progress on the launcher's terminal: when the launcher's
//! stderr is a terminal, the ranks report in `MLX_PROGRESS=events` (unless
//! the user chose a mode) and a [`Renderer`] draws their events as bars,
//! one per rank and task, with their other lines printed above. Otherwise
//! the ranks, whose stderr is a pipe, choose plain lines themselves and
//! their output is forwarded as it is.

use std::io::IsTerminal;
use std::sync::Arc;

use mlx_progress::render::Renderer;

use super::LaunchSpec;

/// Where the lines of one rank's stream go when the launcher draws bars.
#[derive(Clone)]
pub(crate) struct Rendered {
    /// The bars and the lines above them.
    pub renderer: Arc<Renderer>,
    /// The rank whose stream it is.
    pub rank: usize,
}

/// A renderer for the ranks of `spec`, when the launcher's stderr is a
/// terminal and their output passes through the launcher; it then asks the
/// ranks for events (in `spec`'s environment) unless `MLX_PROGRESS` is set
/// in the launcher's or in `spec`'s.
pub(crate) fn renderer_for(spec: &mut LaunchSpec) -> Option<Arc<Renderer>> {
    if !spec.prefix_output || !std::io::stderr().is_terminal() {
        return None;
    }
    let chosen = std::env::var_os(mlx_progress::ENV_MODE).is_some()
        || spec.env.iter().any(|(k, _)| k == mlx_progress::ENV_MODE);
    if !chosen {
        spec.env
            .push((mlx_progress::ENV_MODE.to_string(), "events".to_string()));
    }
    Some(Arc::new(Renderer::new()))
}

impl Rendered {
    /// Handles one line (without its newline) of the rank's stderr: an
    /// event moves a bar, anything else is printed above the bars after `prefix`.
    pub fn stderr_line(&self, prefix: &str, line: &str) {
        if let Some(text) = self.renderer.feed(self.rank, line) {
            self.renderer.println(format!("{prefix}{text}"));
        }
    }

    /// Runs `write` (a line of the rank's stdout) with the bars cleared.
    pub fn stdout<R>(&self, write: impl FnOnce() -> R) -> R {
        self.renderer.suspend(write)
    }

    /// The rank's stderr ended: its bars become lines.
    pub fn ended(&self) {
        self.renderer.end_rank(self.rank);
    }
}
