//! The typed error every fallible operation returns.

use crate::Dtype;

/// Errors from building or evaluating arrays, and from array I/O.
///
/// Each variant names the operation and what was wrong, so that a message
/// alone tells the user where to look.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the operation.
    #[error("{op}: {message}")]
    Shape {
        /// The operation, e.g. `matmul`.
        op: &'static str,
        /// What was expected and what was found.
        message: String,
    },
    /// A dtype the operation does not accept.
    #[error("{op}: {message} (got {dtype})")]
    Dtype {
        /// The operation.
        op: &'static str,
        /// The offending dtype.
        dtype: Dtype,
        /// What was expected.
        message: String,
    },
    /// An axis outside `-ndim..ndim`.
    #[error("{op}: axis {axis} is out of range for an array with {ndim} dimensions")]
    Axis {
        /// The operation.
        op: &'static str,
        /// The axis as given.
        axis: i64,
        /// The number of dimensions of the array.
        ndim: usize,
    },
    /// An invalid argument that is neither a shape, dtype nor axis.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A failure while running a kernel (e.g. an out-of-range index found at eval time).
    #[error("eval of {op}: {message}")]
    Eval {
        /// The primitive that failed.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// A file could not be read or written.
    /// The GPU backend cannot do what was asked: no adapter, out of device
    /// memory, a dtype or feature this adapter lacks, a lost device, or a
    /// primitive without a GPU kernel.
    #[error("gpu: {0}")]
    Gpu(String),
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file was readable but its contents are not what was expected.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What was wrong, with the tensor name or offset where known.
        message: String,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Self {
        Error::Shape {
            op,
            message: message.into(),
        }
    }
    pub(crate) fn dtype(op: &'static str, dtype: Dtype, message: impl Into<String>) -> Self {
        Error::Dtype {
            op,
            dtype,
            message: message.into(),
        }
    }
    pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            message: message.into(),
        }
    }
    /// A GPU backend error.
    pub fn gpu(message: impl Into<String>) -> Self {
        Error::Gpu(message.into())
    }
    /// An error raised by a kernel while evaluating `op`.
    pub fn eval(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Eval {
            op: op.into(),
            message: message.into(),
        }
    }
}
