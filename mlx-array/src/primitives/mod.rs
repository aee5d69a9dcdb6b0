//! Every primitive of the graph, grouped by family. Ops (in [`crate::ops`])
//! validate arguments and build nodes from these.

pub mod attention;
pub mod creation;
pub mod elementwise;
pub mod indexing;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod outputs;
pub mod reduce;
pub mod rope;
pub mod softmax;
pub mod view;

use elementwise::{BinaryOp, UnaryOp};

/// Every primitive's conformance specification, family by family.
#[cfg(feature = "conformance")]
pub(crate) fn specs() -> Vec<crate::conformance::Spec> {
    [
        elementwise::spec::specs(),
        loss::spec::specs(),
        attention::spec::specs(),
        reduce::spec::specs(),
        linalg::spec::specs(),
        softmax::spec::specs(),
        norm::spec::specs(),
        rope::spec::specs(),
        view::spec::specs(),
        indexing::spec::specs(),
        creation::spec::specs(),
        crate::device::spec::specs(),
        crate::autodiff::spec::specs(),
        outputs::spec::specs(),
    ]
    .concat()
}

/// The names of all primitives this crate defines. The conformance suite
/// checks that each one has a test case, so a new primitive cannot go untested.
pub fn primitive_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
    names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
    names.extend([
        "where",
        "swiglu",
        "astype",
        "stop_gradient",
        "reshape",
        "transpose",
        "broadcast_to",
        "slice",
        "contiguous",
        "take",
        "take_along_axis",
        "concatenate",
        "pad",
        "sum",
        "prod",
        "max",
        "min",
        "argmax",
        "argmin",
        "cumsum",
        "matmul",
        "arange",
        "random_bits",
        "scatter_add",
        "slice_update",
        "cross_entropy",
        "cross_entropy_grad",
        "linear_cross_entropy",
        "linear_cross_entropy_grad",
        "linear_cross_entropy_value_and_grad",
        "softmax",
        "attention",
        "attention_grad",
        "rope",
        "rms_norm",
        "rms_norm_grad",
        "tracer",
    ]);
    names
}
