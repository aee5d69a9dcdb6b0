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

/// Every primitive's conformance specification, family by family (with
/// the evaluator's and autodiff's own cases): the list mlx-array's
/// conformance suite hands to [`crate::conformance::main`].
#[cfg(feature = "conformance")]
pub fn specs() -> Vec<crate::conformance::Spec> {
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
