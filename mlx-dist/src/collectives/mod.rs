//! Collectives on [`Array`]s, as lazy graph primitives: they run when the
//! graph is evaluated, like any other op, so the same training code works
//! on one process (where each is the identity) and on many.
//!
//! Every collective runs on [`Stream::Communication`]: the evaluator hands it,
//! in graph order, to the communication thread and goes on with nodes that do
//! not need its result, so (for example) the all_sum of one gradient bucket
//! overlaps the backward computation of the next. Only that thread talks to
//! the group while an `eval` is in flight; `eval` returns once every
//! collective it started has finished.
//!
//! ```
//! use mlx_array::{Array, Dtype};
//! let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();   // size 1 without a launcher
//! let x = mlx_dist::all_sum(&Array::ones(&[10], Dtype::F32), &world).unwrap();
//! assert_eq!(x.to_vec::<f32>().unwrap(), vec![world.size() as f32; 10]);
//! ```
//!
//! What lives here, from the top: these graph primitives (this file), the
//! [`Group`]'s implementation over a connected mesh (`comm`: which algorithm
//! each collective takes), and the algorithms themselves over the mesh's
//! links: the pipelined ring (`ring`) and the owner-computes sum of
//! half-precision blocks (`owners`); `spec` holds their conformance
//! specifications. Layering: the collectives run over `crate::mesh` and its
//! transports, and know nothing of the launcher.

pub(crate) mod comm;
pub(crate) mod owners;
pub(crate) mod ring;

use mlx_array::{Array, ArrayData, Dtype, Error as ArrayError, Primitive, Result, Stream};

use crate::{Group, ReduceOp};

fn dist_err(op: &'static str, e: crate::DistError) -> ArrayError {
    ArrayError::eval(op, e.to_string())
}

/// The input's bytes, contiguous.
fn input_bytes(x: &Array) -> Result<ArrayData> {
    x.dense_data()
}

/// Element-wise sum, max or min over the ranks of a group.
#[derive(Debug, Clone)]
pub struct AllReduce {
    /// The combining operation.
    pub op: ReduceOp,
    /// The ranks taking part.
    pub group: Group,
}

impl Primitive for AllReduce {
    fn name(&self) -> &'static str {
        match self.op {
            ReduceOp::Sum => "all_sum",
            ReduceOp::Max => "all_max",
            ReduceOp::Min => "all_min",
        }
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let n = out.nbytes();
        let given = x.data()?;
        if given.offset() == 0 && x.is_donatable(&given) {
            // Nothing else reads the input: reduce in its buffer rather than
            // a copy, so a gradient bucket is not held twice.
            // SAFETY: `is_donatable` proved this node holds the only other
            // handle, and the view is contiguous from the buffer's start.
            let buf = unsafe { given.as_mut_slice_unchecked::<u8>(n) };
            self.group
                .all_reduce_bytes(buf, x.dtype(), self.op)
                .map_err(|e| dist_err(self.name(), e))?;
            let strides = mlx_array::shape::contiguous_strides(out.shape());
            return Ok(ArrayData::new(given.storage().clone(), strides, 0));
        }
        let src = input_bytes(x)?;
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        let buf = data.as_mut_slice::<u8>(n);
        buf.copy_from_slice(src.as_bytes(x.dtype(), x.size()));
        self.group
            .all_reduce_bytes(buf, x.dtype(), self.op)
            .map_err(|e| dist_err(self.name(), e))?;
        Ok(data)
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // Each rank's input reaches every rank's output: the gradient of a
        // sum over ranks is the sum of the ranks' cotangents.
        match self.op {
            ReduceOp::Sum => Ok(vec![Some(all_sum(ct, &self.group)?)]),
            _ => Err(ArrayError::Invalid {
                op: "vjp",
                message: format!("{} has no vector-Jacobian product", self.name()),
            }),
        }
    }
}

/// The sum over the group of the ranks' partial results of one value, with
/// the gradient of model parallelism: see [`sum_partials`].
#[derive(Debug, Clone)]
pub struct SumPartials {
    /// The ranks whose partial results are summed.
    pub group: Group,
}

impl Primitive for SumPartials {
    fn name(&self) -> &'static str {
        "sum_partials"
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        AllReduce {
            op: ReduceOp::Sum,
            group: self.group.clone(),
        }
        .eval_cpu(inputs, out)
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // Every rank computes the same loss from the one sum: its gradient
        // reaches each partial result unchanged.
        Ok(vec![Some(ct.clone())])
    }
}

/// The identity, whose gradient is summed over the group: see [`sum_gradients`].
#[derive(Debug, Clone)]
pub struct SumGradients {
    /// The ranks whose gradients are summed.
    pub group: Group,
}

impl Primitive for SumGradients {
    fn name(&self) -> &'static str {
        "sum_gradients"
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // The input feeds every rank's shard of the computation: its
        // gradient is the sum of what each shard sends back, placed where
        // the input lives (the sum is made on the CPU).
        let summed = sum_partials(ct, &self.group)?;
        Ok(vec![Some(summed.to_device(inputs[0].device()))])
    }
}

/// Concatenation of every rank's input along axis 0.
#[derive(Debug, Clone)]
pub struct AllGather {
    /// The ranks taking part.
    pub group: Group,
}

impl Primitive for AllGather {
    fn name(&self) -> &'static str {
        "all_gather"
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let src = input_bytes(x)?;
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        let buf = data.as_mut_slice::<u8>(out.nbytes());
        self.group
            .all_gather_into_bytes(src.as_bytes(x.dtype(), x.size()), buf, x.dtype())
            .map_err(|e| dist_err("all_gather", e))?;
        Ok(data)
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        Ok(vec![Some(sum_scatter(ct, &self.group)?)])
    }
}

/// Sum over ranks, of which rank `r` keeps the `r`-th block along axis 0;
/// with `mean`, divided by the number of ranks.
#[derive(Debug, Clone)]
pub struct SumScatter {
    /// The ranks taking part.
    pub group: Group,
    /// Divide the sum by the group's size (float32 only; [`mean_scatter`]
    /// builds other dtypes' means from a sum and a division).
    pub mean: bool,
}

impl Primitive for SumScatter {
    fn name(&self) -> &'static str {
        if self.mean {
            "mean_scatter"
        } else {
            "sum_scatter"
        }
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let src = input_bytes(x)?;
        // The sum lands in the output: no copy of the input is made.
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        self.group
            .sum_scatter_into_bytes(
                src.as_bytes(x.dtype(), x.size()),
                data.as_mut_slice::<u8>(out.nbytes()),
                x.dtype(),
            )
            .map_err(|e| dist_err(self.name(), e))?;
        if self.mean {
            // In the sum's own buffer while it is hot: the same float32
            // division as `div_scalar`, without a second buffer or pass
            // through memory.
            let size = self.group.size() as f32;
            for v in data.as_mut_slice::<f32>(out.size()) {
                *v /= size;
            }
        }
        Ok(data)
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let gathered = all_gather(ct, &self.group)?;
        Ok(vec![Some(if self.mean {
            gathered.div_scalar(self.group.size() as f64)?
        } else {
            gathered
        })])
    }
}

/// Sends the input to another rank; the output is the input (so the send
/// can be kept in the graph and evaluated).
#[derive(Debug, Clone)]
pub struct Send {
    /// Destination rank.
    pub dst: usize,
    /// The group the rank belongs to.
    pub group: Group,
}

impl Primitive for Send {
    fn name(&self) -> &'static str {
        "send"
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let src = input_bytes(x)?;
        self.group
            .send_bytes(src.as_bytes(x.dtype(), x.size()), x.dtype(), self.dst)
            .map_err(|e| dist_err("send", e))?;
        Ok(src)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        mlx_array::primitive::no_gradient(inputs)
    }
}

/// Receives an array of the output's shape and dtype from another rank.
#[derive(Debug, Clone)]
pub struct Recv {
    /// Source rank.
    pub src: usize,
    /// The group the rank belongs to.
    pub group: Group,
}

impl Primitive for Recv {
    fn name(&self) -> &'static str {
        "recv"
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, _inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        let buf = data.as_mut_slice::<u8>(out.nbytes());
        self.group
            .recv_bytes(buf, out.dtype(), self.src)
            .map_err(|e| dist_err("recv", e))?;
        Ok(data)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        mlx_array::primitive::no_gradient(inputs)
    }
}

fn reduce(op: ReduceOp, x: &Array, group: &Group) -> Result<Array> {
    elementwise(
        AllReduce {
            op,
            group: group.clone(),
        },
        x,
        group,
    )
}

/// `p`'s node on `x`, shaped like it; `x` itself on a group of one, where
/// every elementwise collective is the identity.
fn elementwise(p: impl Primitive, x: &Array, group: &Group) -> Result<Array> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    Ok(Array::from_primitive(
        p,
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    ))
}

/// Element-wise sum over the group (the identity on a group of one). Its
/// gradient is the sum of the ranks' gradients, as data parallelism needs
/// (each rank's loss is a term of the objective); for partial results of
/// one value that every rank then uses alike, see [`sum_partials`].
pub fn all_sum(x: &Array, group: &Group) -> Result<Array> {
    reduce(ReduceOp::Sum, x, group)
}

/// Element-wise sum over the group of partial results of one value, as
/// model (tensor) parallelism makes them: each rank multiplies its slice of
/// the input by its slice of a weight (a row-parallel linear layer), and
/// the sum is the whole product on every rank. The ranks then compute the
/// same loss from it, so its gradient reaches each partial result
/// unchanged: the backward pass is the identity (MLX's `all_sum` vjp,
/// Megatron-LM's "reduce from the model-parallel region").
///
/// [`all_sum`] differs only in its gradient: it assumes each rank has a loss
/// of its own (data parallelism, whose objective is their sum), so its
/// gradient is the sum of the ranks' gradients.
///
/// ```
/// use mlx_array::{Array, Dtype};
/// let parts = mlx_dist::run_local(2, |g| {
///     let x = Array::full(&[2], (g.rank() + 1) as f64, Dtype::F32);
///     mlx_dist::sum_partials(&x, &g).unwrap().to_vec::<f32>().unwrap()
/// })
/// .unwrap();
/// assert_eq!(parts, vec![vec![3.0; 2], vec![3.0; 2]]);
/// ```
pub fn sum_partials(x: &Array, group: &Group) -> Result<Array> {
    let p = SumPartials {
        group: group.clone(),
    };
    elementwise(p, x, group)
}

/// The identity, whose gradient is summed over the group (MLX's
/// `sum_gradients`, Megatron-LM's "copy to the model-parallel region"):
/// put on the input of a column-parallel linear layer, whose ranks each
/// compute a slice of the output from the whole input, so the input's
/// gradient is the sum of the slices' contributions.
pub fn sum_gradients(x: &Array, group: &Group) -> Result<Array> {
    let p = SumGradients {
        group: group.clone(),
    };
    elementwise(p, x, group)
}

/// Element-wise maximum over the group.
pub fn all_max(x: &Array, group: &Group) -> Result<Array> {
    reduce(ReduceOp::Max, x, group)
}

/// Element-wise minimum over the group.
pub fn all_min(x: &Array, group: &Group) -> Result<Array> {
    reduce(ReduceOp::Min, x, group)
}

/// Every rank's `x` concatenated along axis 0 (a scalar counts as `[1]`).
pub fn all_gather(x: &Array, group: &Group) -> Result<Array> {
    let x = if x.ndim() == 0 {
        x.reshape(&[1])?
    } else {
        x.clone()
    };
    if group.size() == 1 {
        return Ok(x);
    }
    let mut shape = x.shape().to_vec();
    shape[0] *= group.size();
    let dtype = x.dtype();
    Ok(Array::from_primitive(
        AllGather {
            group: group.clone(),
        },
        vec![x],
        shape,
        dtype,
    ))
}

/// The sum over the group, of which this rank keeps block `rank` of `size`
/// equal blocks along axis 0 (whose length must divide by the group size).
pub fn sum_scatter(x: &Array, group: &Group) -> Result<Array> {
    scatter(x, group, false)
}

/// The mean over the group, of which this rank keeps block `rank` (as
/// [`sum_scatter`], divided by the group's size): what a data-parallel rank
/// needs of the averaged gradients when it updates only its shard of the
/// parameters. Equals `sum_scatter(x, group)?.div_scalar(size)` bit for bit;
/// for float32 the division happens in the sum's buffer, so no second
/// buffer of the shard's size is made.
///
/// ```
/// use mlx_array::{Array, Dtype};
/// let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();   // size 1 without a launcher
/// let n = world.size();
/// let x = Array::full(&[2 * n], 3.0, Dtype::F32);
/// let mine = mlx_dist::mean_scatter(&x, &world).unwrap();
/// assert_eq!(mine.to_vec::<f32>().unwrap(), vec![3.0; 2]);
/// ```
pub fn mean_scatter(x: &Array, group: &Group) -> Result<Array> {
    if x.dtype() == Dtype::F32 {
        scatter(x, group, true)
    } else {
        sum_scatter(x, group)?.div_scalar(group.size() as f64)
    }
}

/// [`sum_scatter`], or with `mean` [`mean_scatter`] of float32.
fn scatter(x: &Array, group: &Group, mean: bool) -> Result<Array> {
    let n = group.size();
    let op = if mean { "mean_scatter" } else { "sum_scatter" };
    if x.ndim() == 0 || !x.shape()[0].is_multiple_of(n) {
        return Err(ArrayError::Shape {
            op,
            message: format!(
                "axis 0 of shape {:?} does not split over {n} ranks",
                x.shape()
            ),
        });
    }
    if n == 1 {
        return Ok(x.clone());
    }
    let mut shape = x.shape().to_vec();
    shape[0] /= n;
    Ok(Array::from_primitive(
        SumScatter {
            group: group.clone(),
            mean,
        },
        vec![x.clone()],
        shape,
        x.dtype(),
    ))
}

/// Sends `x` to rank `dst`; evaluate the returned array to perform the send.
pub fn send(x: &Array, dst: usize, group: &Group) -> Result<Array> {
    check_peer("send", dst, group)?;
    Ok(Array::from_primitive(
        Send {
            dst,
            group: group.clone(),
        },
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    ))
}

/// Receives an array of `shape` and `dtype` from rank `src`.
pub fn recv(shape: &[usize], dtype: Dtype, src: usize, group: &Group) -> Result<Array> {
    check_peer("recv", src, group)?;
    Ok(Array::from_primitive(
        Recv {
            src,
            group: group.clone(),
        },
        vec![],
        shape.to_vec(),
        dtype,
    ))
}

/// Receives an array shaped like `like` from rank `src`.
pub fn recv_like(like: &Array, src: usize, group: &Group) -> Result<Array> {
    recv(like.shape(), like.dtype(), src, group)
}

fn check_peer(op: &'static str, peer: usize, group: &Group) -> Result<()> {
    if peer >= group.size() || peer == group.rank() {
        return Err(ArrayError::Invalid {
            op,
            message: format!(
                "rank {peer} is not another rank of this group (rank {} of {})",
                group.rank(),
                group.size()
            ),
        });
    }
    Ok(())
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
