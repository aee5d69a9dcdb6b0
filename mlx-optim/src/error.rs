//! The typed error every fallible optimizer operation returns.

/// Errors from building updates, validating configurations and loading state.
///
/// Messages name the parameter (dotted path) and, for files, the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An array operation failed.
    #[error(transparent)]
    Array(#[from] mlx_array::Error),
    /// An invalid optimizer or schedule configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A gradient whose path names no parameter.
    #[error("the gradient `{0}` has no matching parameter")]
    NoParameter(String),
    /// A gradient whose shape differs from its parameter's.
    #[error(
        "parameter `{param}`: the gradient has shape {grad:?}, the parameter has shape {expected:?}"
    )]
    GradientShape {
        /// The parameter path.
        param: String,
        /// The parameter's shape.
        expected: Vec<usize>,
        /// The gradient's shape.
        grad: Vec<usize>,
    },
    /// Saved state lacks an entry the model's parameters need.
    #[error("{file}: no optimizer state `{slot}` for parameter `{param}`")]
    MissingState {
        /// The state file.
        file: String,
        /// The parameter path.
        param: String,
        /// The missing slot (`m`, `v`, ...).
        slot: String,
    },
    /// Saved state for a parameter the model does not have (or an unknown slot).
    #[error("{file}: optimizer state `{name}` matches no parameter of the model{detail}")]
    UnexpectedState {
        /// The state file.
        file: String,
        /// The dotted state name.
        name: String,
        /// Extra explanation (may be empty).
        detail: String,
    },
    /// Saved state whose shape or dtype differs from its parameter's.
    #[error("{file}: optimizer state `{name}` is {found}, the parameter is {expected}")]
    StateMismatch {
        /// The state file.
        file: String,
        /// The dotted state name.
        name: String,
        /// The parameter's shape and dtype.
        expected: String,
        /// The saved shape and dtype.
        found: String,
    },
    /// Gated steps (see [`crate::Gate`]) whose outcome the host has not been
    /// told yet ([`crate::OptimizerState::settle`]) where the step count
    /// must be known: saving the state, or an ungated step.
    #[error(
        "{0}: {1} gated step(s) are not settled yet (call OptimizerState::settle with each outcome first)"
    )]
    Unsettled(&'static str, usize),
    /// [`crate::OptimizerState::settle`] with no gated step pending.
    #[error("no gated step is waiting to be settled")]
    NothingToSettle,
    /// A state file that is readable but not optimizer state.
    #[error("{file}: {message}")]
    Format {
        /// The state file.
        file: String,
        /// What was wrong.
        message: String,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
