//! The `Primitive` trait: one node kind of the lazy graph.

use std::fmt;

use crate::array::OutputSpec;
use crate::{Array, Result};

/// The data a kernel reads and returns, kept importable from here: it lives
/// in the leaf module [`crate::data`].
pub use crate::data::ArrayData;

/// A computation that produces one array from its inputs.
///
/// Ops validate their arguments, compute the output shape and dtype, and build
/// an [`Array`] whose node holds a primitive (see [`Array::from_primitive`]).
/// When the array is evaluated, every input is already evaluated and the
/// primitive's kernel runs. Other crates add primitives of their own (the
/// collectives of `mlx-dist`, for example) by implementing this trait.
pub trait Primitive: Send + Sync + fmt::Debug + 'static {
    /// A short stable name (`add`, `matmul`, `all_sum`) used in errors and in
    /// the conformance suite.
    fn name(&self) -> &'static str;

    /// Runs the CPU kernel. Every input is evaluated; `out` carries the output
    /// shape and dtype chosen when the op was built. Every single-output
    /// primitive implements it (primitives with several outputs implement
    /// [`eval_cpu_outputs`](Self::eval_cpu_outputs) instead); the default
    /// says there is no CPU kernel.
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let _ = (inputs, out);
        Err(crate::Error::eval(self.name(), "no CPU kernel"))
    }

    /// Runs the GPU kernel (WGSL through wgpu). Every input is evaluated and
    /// lives on the GPU; the result must too. The default says there is no
    /// GPU kernel: placing such a primitive on the GPU is an error at eval,
    /// never a silent CPU fallback.
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let _ = (inputs, out);
        Err(no_gpu_kernel(self.name()))
    }

    /// For a primitive with several outputs (built with
    /// [`Array::from_primitive_outputs`]): runs the CPU kernel once for all
    /// of them, returning one buffer per entry of `outputs`, of its shape
    /// and dtype.
    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let _ = (inputs, outputs);
        Err(crate::Error::eval(
            self.name(),
            "a single-output primitive, built with Array::from_primitive",
        ))
    }

    /// [`eval_cpu_outputs`](Self::eval_cpu_outputs) on the GPU.
    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let _ = (inputs, outputs);
        Err(no_gpu_kernel(self.name()))
    }

    /// Whether this node's GPU kernel can add another array to its result
    /// as it stores it ([`eval_gpu_adding`](Self::eval_gpu_adding)): the
    /// GPU evaluator then computes an add whose other term is this node,
    /// read by nothing else, in this node's kernel (a matrix product's
    /// epilogue) instead of a kernel of its own.
    fn gpu_adds_in_kernel(&self, inputs: &[Array], out: &Array) -> bool {
        let _ = (inputs, out);
        false
    }

    /// `addend + (this node's result)` on the GPU, for a node whose
    /// [`gpu_adds_in_kernel`](Self::gpu_adds_in_kernel) is true: `addend`
    /// is dense, of the output's dtype and element count, read in the
    /// output's row-major order; the result has `out`'s shape and equals
    /// this node's result followed by an add, bit for bit.
    fn eval_gpu_adding(
        &self,
        inputs: &[Array],
        out: &Array,
        addend: &crate::Operand<'_>,
    ) -> Result<ArrayData> {
        let _ = (inputs, out, addend);
        Err(no_gpu_kernel(self.name()))
    }

    /// For elementwise primitives: the WGSL expression computing one output
    /// element from `a0`, `a1`, … (each input's element in its compute
    /// type), so the GPU evaluator can fuse chains of them into one kernel.
    fn gpu_expression(&self, inputs: &[Array], out: &Array) -> Option<String> {
        let _ = (inputs, out);
        None
    }

    /// The device this primitive always runs on, whatever the default
    /// device (`None`: the default). Communication-stream primitives run
    /// on the CPU.
    fn device(&self) -> Option<crate::Device> {
        match self.stream() {
            Stream::Communication => Some(crate::Device::Cpu),
            Stream::Compute => None,
        }
    }

    /// Where the evaluator runs this primitive. Compute primitives run in
    /// graph order on the calling thread; [`Stream::Communication`] ones
    /// (collectives) are handed, in graph order, to one communication thread
    /// and run there while the evaluator goes on with nodes that do not need
    /// their result, so gradient communication overlaps the backward pass.
    fn stream(&self) -> Stream {
        Stream::Compute
    }

    /// The vector-Jacobian product: given the cotangent of the output, the
    /// cotangent of each input (`None` where no gradient flows, which counts
    /// as zero). Built lazily from ops, so backward graphs evaluate together
    /// with the forward one. `output` is this primitive's own output.
    ///
    /// The default says the primitive is not differentiable; primitives that
    /// are, and those whose inputs simply get no gradient, override it.
    fn vjp(
        &self,
        inputs: &[Array],
        output: &Array,
        cotangent: &Array,
    ) -> Result<Vec<Option<Array>>> {
        let _ = (inputs, output, cotangent);
        Err(crate::Error::invalid(
            "vjp",
            format!("primitive `{}` has no vector-Jacobian product", self.name()),
        ))
    }

    /// [`Primitive::vjp`] where each input's cotangent gathered so far (from
    /// the nodes after this one that read it) is at hand in
    /// `accumulated[i]`. A primitive whose gradient kernel can add one in
    /// its own pass takes it (leaving `None`) and returns the sum as that
    /// input's cotangent, which saves the add's kernel; those it leaves are
    /// added as usual. The default takes none.
    fn vjp_accumulating(
        &self,
        inputs: &[Array],
        output: &Array,
        cotangent: &Array,
        accumulated: &mut [Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let _ = accumulated;
        self.vjp(inputs, output, cotangent)
    }

    /// For a primitive whose output the backward pass recomputes instead
    /// of keeping ([`crate::autodiff::rematerialize`]): that recomputation
    /// from `inputs`, started only after `after`, built once however often
    /// it is asked for. Autodiff hands it, instead of this node, to the
    /// vector-Jacobian products of the nodes that read this one. The
    /// default (`None`): the value is kept.
    fn recompute_for_backward(&self, inputs: &[Array], after: &[Array]) -> Option<Result<Array>> {
        let _ = (inputs, after);
        None
    }

    /// The vector-Jacobian product of a primitive with several outputs:
    /// given the cotangent of each output (`None` where none reaches it),
    /// the cotangent of each input. `outputs` are this primitive's outputs.
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let _ = (inputs, outputs, cotangents);
        Err(crate::Error::invalid(
            "vjp",
            format!("primitive `{}` has no vector-Jacobian product", self.name()),
        ))
    }
}

/// The stream a primitive runs on (see [`Primitive::stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The evaluating thread, in graph order.
    Compute,
    /// The communication thread of the evaluating thread (one per process
    /// when a process evaluates on one thread), in the order the evaluator
    /// reaches the nodes (the same order on every rank for the same graph).
    Communication,
}

fn no_gpu_kernel(name: &str) -> crate::Error {
    crate::Error::gpu(format!(
        "primitive `{name}` has no GPU kernel; build it on the CPU (Device::Cpu)"
    ))
}

/// The error of differentiating `what`, a gradient's node: no second
/// derivatives.
pub(crate) fn no_second_derivatives(what: &str) -> crate::Error {
    crate::Error::invalid(
        "vjp",
        format!("{what} has no vector-Jacobian product (no second derivatives)"),
    )
}

/// The `vjp` of a primitive through which no gradient flows to any input.
pub fn no_gradient(inputs: &[Array]) -> Result<Vec<Option<Array>>> {
    Ok(vec![None; inputs.len()])
}
