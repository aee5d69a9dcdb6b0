//! `Array`: the cheap-to-clone lazy handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::data::{ArrayData, Operand};
use crate::device::Device;
use crate::primitive::Primitive;
use crate::shape::size_of_shape;
use crate::{Dtype, Element, Error, Result};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A lazy n-dimensional array.
///
/// Cloning is cheap (a reference count). Building an expression records a
/// graph; [`eval`](fn@crate::eval) runs it. Reading values (`item`, `to_vec`,
/// `Display`) evaluates implicitly.
///
/// ```
/// use mlx_array::{Array, Dtype};
/// let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
/// let b = a.add(&Array::ones(&[3], Dtype::F32)).unwrap().exp().unwrap();
/// assert_eq!(b.shape(), &[3]);
/// let v: Vec<f32> = b.to_vec().unwrap();
/// assert!((v[0] - 2f32.exp()).abs() < 1e-5);
/// ```
#[derive(Clone)]
pub struct Array {
    pub(crate) node: Arc<Node>,
}

pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: Dtype,
    pub(crate) device: Device,
    pub(crate) kind: NodeKind,
    pub(crate) state: Mutex<State>,
    /// This array cast to another dtype, when a primitive computed that
    /// cast beside it ([`Array::remember_cast`]): `astype` reads it.
    pub(crate) cast: OnceLock<Array>,
}

/// What a node's value is.
#[derive(Clone)]
pub(crate) enum NodeKind {
    /// An array: one output of its primitive.
    Single,
    /// The shared computation of a primitive with several outputs (see
    /// [`Array::from_primitive_outputs`]): never handed to users, read only
    /// through its [`NodeKind::Output`] nodes.
    Outputs(Arc<[OutputSpec]>),
    /// Output `index` of the multi-output node that is its one input.
    Output(usize),
}

/// The shape and dtype of one output of a multi-output primitive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    /// The output's shape.
    pub shape: Vec<usize>,
    /// The output's dtype.
    pub dtype: Dtype,
}

pub(crate) enum State {
    /// Not yet computed: how to compute it.
    Pending {
        primitive: Arc<dyn Primitive>,
        inputs: Vec<Array>,
    },
    /// Computed and detached from its inputs.
    Ready(ArrayData),
    /// The outputs of a multi-output node, computed and detached.
    ReadyOutputs(Vec<ArrayData>),
}

impl State {
    /// The primitive and inputs of a pending node.
    pub(crate) fn pending(&self) -> Option<(&Arc<dyn Primitive>, &Vec<Array>)> {
        match self {
            State::Pending { primitive, inputs } => Some((primitive, inputs)),
            State::Ready(_) | State::ReadyOutputs(_) => None,
        }
    }
}

impl Drop for Node {
    /// Releases a chain of pending nodes without recursion, so dropping a graph
    /// 100k nodes deep cannot overflow the stack.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let State::Pending { inputs, .. } = state else {
            return;
        };
        let mut stack = std::mem::take(inputs);
        while let Some(a) = stack.pop() {
            if let Some(mut node) = Arc::into_inner(a.node) {
                let s = node.state.get_mut().unwrap_or_else(|e| e.into_inner());
                if let State::Pending { inputs, .. } = s {
                    stack.append(inputs);
                }
            }
        }
    }
}

impl Array {
    pub(crate) fn with_state(
        shape: Vec<usize>,
        dtype: Dtype,
        device: Device,
        state: State,
    ) -> Array {
        Array::node(shape, dtype, device, NodeKind::Single, state)
    }

    fn node(
        shape: Vec<usize>,
        dtype: Dtype,
        device: Device,
        kind: NodeKind,
        state: State,
    ) -> Array {
        Array {
            node: Arc::new(Node {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                shape,
                dtype,
                device,
                kind,
                state: Mutex::new(state),
                cast: OnceLock::new(),
            }),
        }
    }

    /// An array computed by `primitive` from `inputs`, with the given output
    /// shape and dtype. This is how ops (here and in other crates) build nodes.
    ///
    /// The node is placed on the primitive's own device if it has one, else
    /// on the [default device](crate::default_device); inputs living on the
    /// other device reach it through a transfer node.
    pub fn from_primitive(
        primitive: impl Primitive,
        inputs: Vec<Array>,
        shape: Vec<usize>,
        dtype: Dtype,
    ) -> Array {
        let (device, inputs) = placed(&primitive, inputs);
        Array::with_state(
            shape,
            dtype,
            device,
            State::Pending {
                primitive: Arc::new(primitive),
                inputs,
            },
        )
    }

    /// The arrays a primitive with several outputs computes together from
    /// `inputs`, one per entry of `outputs` (as MLX's `array::make_arrays`).
    /// The primitive runs once, through
    /// [`Primitive::eval_cpu_outputs`]/[`Primitive::eval_gpu_outputs`], when
    /// any of them is evaluated; under autodiff it gets the cotangents of all
    /// of them at once ([`Primitive::vjp_outputs`]). An output nobody holds
    /// any more is freed as soon as the primitive has run.
    ///
    /// Placement is as for [`Array::from_primitive`].
    pub fn from_primitive_outputs(
        primitive: impl Primitive,
        inputs: Vec<Array>,
        outputs: Vec<OutputSpec>,
    ) -> Vec<Array> {
        let (device, inputs) = placed(&primitive, inputs);
        let dtype = outputs.first().map_or(Dtype::F32, |o| o.dtype);
        let n = outputs.len();
        let group = Array::node(
            vec![],
            dtype,
            device,
            NodeKind::Outputs(outputs.into()),
            State::Pending {
                primitive: Arc::new(primitive),
                inputs,
            },
        );
        (0..n).map(|i| group.output(i)).collect()
    }

    /// Output `index` of this multi-output node, as a new lazy array.
    pub(crate) fn output(&self, index: usize) -> Array {
        let NodeKind::Outputs(specs) = &self.node.kind else {
            unreachable!("output() of a single-output node")
        };
        let spec = &specs[index];
        Array::node(
            spec.shape.clone(),
            spec.dtype,
            self.device(),
            NodeKind::Output(index),
            State::Pending {
                primitive: Arc::new(crate::primitives::outputs::Output { index }),
                inputs: vec![self.clone()],
            },
        )
    }

    /// The outputs' shapes and dtypes, when this is a multi-output node.
    pub(crate) fn output_specs(&self) -> Option<&[OutputSpec]> {
        match &self.node.kind {
            NodeKind::Outputs(specs) => Some(specs),
            _ => None,
        }
    }

    /// The evaluated data of output `index` of this multi-output node.
    pub(crate) fn output_data(&self, index: usize) -> Result<ArrayData> {
        match &*self.lock() {
            State::ReadyOutputs(d) if index < d.len() => Ok(d[index].clone()),
            _ => Err(Error::eval(
                "output",
                format!("output {index} read from a node that has not computed it"),
            )),
        }
    }

    /// An already evaluated array holding `data` (on the device its storage is on).
    pub fn from_data(data: ArrayData, shape: Vec<usize>, dtype: Dtype) -> Array {
        let device = if data.storage().is_device() {
            Device::Gpu
        } else {
            Device::Cpu
        };
        Array::with_state(shape, dtype, device, State::Ready(data))
    }

    /// An array holding a copy of `values` with the given shape.
    ///
    /// Fails when the number of values does not match the shape.
    pub fn from_slice<T: Element>(values: &[T], shape: &[usize]) -> Result<Array> {
        // Checked: a product that wrapped would let too few values "fill" it.
        if values.len() != crate::shape::checked_size_of_shape(shape)? {
            return Err(Error::shape(
                "from_slice",
                format!("{} values cannot fill shape {shape:?}", values.len()),
            ));
        }
        Ok(Array::from_data(
            ArrayData::from_slice(values, shape),
            shape.to_vec(),
            T::DTYPE,
        ))
    }

    /// Like [`Array::from_slice`], taking ownership of a vector.
    pub fn from_vec<T: Element>(values: Vec<T>, shape: &[usize]) -> Result<Array> {
        Array::from_slice(&values, shape)
    }

    /// A 0-dimensional array holding `value`.
    pub fn scalar<T: Element>(value: T) -> Array {
        Array::from_data(ArrayData::from_slice(&[value], &[]), vec![], T::DTYPE)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.node.shape
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.node.dtype
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.node.shape.len()
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        size_of_shape(&self.node.shape)
    }

    /// Bytes the elements occupy when dense.
    pub fn nbytes(&self) -> usize {
        self.size() * self.dtype().size_of()
    }

    /// Size of dimension `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> Result<usize> {
        let a = crate::shape::normalize_axis("dim", axis, self.ndim())?;
        Ok(self.node.shape[a])
    }

    /// A process-unique identifier of this node (clones share it).
    pub fn id(&self) -> u64 {
        self.node.id
    }

    /// True once the array has been computed.
    pub fn is_evaluated(&self) -> bool {
        !matches!(*self.lock(), State::Pending { .. })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.node.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name of the primitive that computes this array, if it is still pending.
    pub fn primitive_name(&self) -> Option<&'static str> {
        match &*self.lock() {
            State::Pending { primitive, .. } => Some(primitive.name()),
            State::Ready(_) | State::ReadyOutputs(_) => None,
        }
    }

    /// Records `copy` as this array cast to `copy`'s dtype: from now on
    /// [`astype`](Self::astype) to that dtype reads `copy` instead of
    /// running a cast (the node it builds still differentiates as a cast of
    /// this array, and so does one of a tracer standing in for it). For a
    /// primitive that computes a cast of one of its outputs in the same
    /// pass (the fused Adam writes the new float32 parameter and its
    /// float16 copy for the next forward pass); it vouches that `copy`
    /// holds exactly the values the cast would, which this cannot check
    /// without computing both.
    ///
    /// Fails when `copy` differs in shape or device, is not a float dtype
    /// other than this one, or when this array already has a remembered
    /// cast.
    ///
    /// ```
    /// use mlx_array::{Array, Dtype};
    /// let p = Array::from_slice(&[1.5f32, -2.0], &[2]).unwrap();
    /// let half = p.astype(Dtype::F16).unwrap();
    /// half.eval().unwrap();
    /// p.remember_cast(&half).unwrap();
    /// // A cast of `p` that reads `half` (no kernel runs for it).
    /// let again = p.astype(Dtype::F16).unwrap();
    /// assert_eq!(again.primitive_name(), Some("remembered_cast"));
    /// assert_eq!(again.to_vec::<half::f16>().unwrap(), half.to_vec::<half::f16>().unwrap());
    /// ```
    pub fn remember_cast(&self, copy: &Array) -> Result<()> {
        const OP: &str = "remember_cast";
        if copy.shape() != self.shape() || copy.device() != self.device() {
            return Err(Error::shape(
                OP,
                format!(
                    "a cast keeps the shape and device: {:?} on {:?} is no cast of {:?} on {:?}",
                    copy.shape(),
                    copy.device(),
                    self.shape(),
                    self.device()
                ),
            ));
        }
        if !copy.dtype().is_float() || !self.dtype().is_float() || copy.dtype() == self.dtype() {
            return Err(Error::dtype(
                OP,
                copy.dtype(),
                format!(
                    "a remembered cast goes between two float dtypes; got {} to {}",
                    self.dtype(),
                    copy.dtype()
                ),
            ));
        }
        self.node
            .cast
            .set(copy.clone())
            .map_err(|_| Error::invalid(OP, "this array already has a remembered cast".to_string()))
    }

    /// The cast to `dtype` recorded by [`remember_cast`](Self::remember_cast).
    pub(crate) fn remembered_cast(&self, dtype: Dtype) -> Option<Array> {
        self.node.cast.get().filter(|c| c.dtype() == dtype).cloned()
    }

    /// Gives this fresh node `x`'s remembered cast (a tracer of `x`).
    pub(crate) fn inherit_cast(&self, x: &Array) {
        if let Some(c) = x.node.cast.get() {
            let _ = self.node.cast.set(c.clone());
        }
    }

    /// The arrays this one is computed from while it is pending (none once
    /// computed): with [`primitive_name`](Self::primitive_name), enough for
    /// a library to recognise a pattern in a graph it is handed, as
    /// `mlx-optim` reads a float32 gradient widened from half precision in
    /// its half-precision form.
    pub fn pending_inputs(&self) -> Vec<Array> {
        match &*self.lock() {
            State::Pending { inputs, .. } => inputs.clone(),
            State::Ready(_) | State::ReadyOutputs(_) => Vec::new(),
        }
    }

    /// The evaluated data. Fails if the array has not been evaluated; kernels
    /// call it on their inputs, which the evaluator has already computed.
    pub fn data(&self) -> Result<ArrayData> {
        match &*self.lock() {
            State::Ready(d) => Ok(d.clone()),
            State::Pending { primitive, .. } => Err(Error::eval(
                primitive.name(),
                "data() called on an array that has not been evaluated",
            )),
            State::ReadyOutputs(_) => Err(Error::eval(
                "data",
                "a multi-output node has no data of its own; read its outputs",
            )),
        }
    }

    /// The evaluated data with this array's shape and dtype: what a kernel
    /// takes for one operand. Fails as [`data`](Self::data) does.
    pub fn operand(&self) -> Result<Operand<'_>> {
        Ok(Operand::new(self.data()?, self.shape(), self.dtype()))
    }

    /// True when `data` (this input's evaluated data, as just read by a
    /// kernel) may be overwritten: the array is referenced only by the node
    /// being computed and the evaluator's working copy of its inputs, the
    /// buffer only by this array and `data`, and the view is dense.
    /// Kernels use it to write their output over an input they consume last.
    pub fn is_donatable(&self, data: &ArrayData) -> bool {
        self.is_donatable_shared(data, 1)
    }

    /// [`is_donatable`](Self::is_donatable) for a buffer that `views`
    /// arrays share, each through one input of the node being computed (and
    /// the kernel's copy of its data): for a kernel that consumes several
    /// views of one buffer and overwrites all of them, like a fused
    /// optimizer step whose state rows came from one earlier output.
    pub fn is_donatable_shared(&self, data: &ArrayData, views: usize) -> bool {
        Arc::strong_count(&self.node) <= 2
            && Arc::strong_count(data.storage()) <= 2 * views
            && data.is_contiguous(self.shape())
            && data.storage().capacity() >= self.nbytes()
            && self.nbytes() > 0
    }

    /// Evaluates this array (see [`eval`](fn@crate::eval)).
    pub fn eval(&self) -> Result<()> {
        crate::eval(self)
    }

    /// This evaluated array's data laid out densely in row-major order: its
    /// own buffer when it already is, else a copy on the device that holds
    /// it. For primitives of other crates that hand raw bytes on
    /// (collectives, sharded layers) from inside an eval.
    ///
    /// ```
    /// use mlx_array::Array;
    /// let x = Array::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    /// let t = x.swapaxes(0, 1).unwrap(); // a strided view of x's buffer
    /// t.eval().unwrap();
    /// let dense = t.dense_data().unwrap();
    /// assert_eq!(dense.as_slice::<f32>(6), &[1., 4., 2., 5., 3., 6.]);
    /// // Already dense: the same buffer, no copy.
    /// x.eval().unwrap();
    /// let own = x.dense_data().unwrap();
    /// assert!(std::sync::Arc::ptr_eq(own.storage(), x.data().unwrap().storage()));
    /// ```
    pub fn dense_data(&self) -> Result<ArrayData> {
        let x = self.operand()?;
        if x.is_contiguous() {
            Ok(x.data)
        } else if x.data.storage().is_device() {
            crate::backend::gpu::copy_contiguous(&x)
        } else {
            Ok(crate::backend::cpu::copy::contiguous(&x))
        }
    }

    /// The elements in row-major order, converted to `T` (as `astype` would).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        // Brought to the host first, then converted there, whatever the
        // default device (the GPU cannot hold every dtype, i64 among them).
        let a = crate::device::with_device(Device::Cpu, || {
            let a = self.to_device(Device::Cpu);
            let a = if a.dtype() == T::DTYPE {
                a
            } else {
                a.astype(T::DTYPE)?
            };
            a.contiguous()
        })?;
        a.eval()?;
        let data = a.data()?;
        Ok(data.as_slice::<T>(a.size()).to_vec())
    }

    /// The single element of a one-element array, converted to `T`.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::shape(
                "item",
                format!(
                    "item() needs exactly one element, the array has shape {:?}",
                    self.shape()
                ),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array(shape={:?}, dtype={}", self.shape(), self.dtype())?;
        match self.primitive_name() {
            Some(p) => write!(f, ", pending {p} on {})", self.device()),
            None => write!(f, ")"),
        }
    }
}

/// The device a node of `primitive` goes on (its own, else the default) and
/// `inputs` brought there.
fn placed(primitive: &impl Primitive, inputs: Vec<Array>) -> (Device, Vec<Array>) {
    let device = primitive.device().unwrap_or_else(crate::default_device);
    if inputs.iter().all(|x| x.device() == device) {
        (device, inputs)
    } else {
        (
            device,
            inputs.into_iter().map(|x| x.to_device(device)).collect(),
        )
    }
}

#[cfg(test)]
mod shape_overflow_tests {
    use super::*;

    /// [2^63, 2] wraps to 0 elements: unchecked, an empty slice would
    /// "fill" it and the array's buffer would be short by 2^64 elements.
    #[test]
    fn an_array_of_a_shape_whose_size_overflows_is_refused() {
        let huge = 1usize << (usize::BITS - 1);
        let e = Array::from_slice::<f32>(&[], &[huge, 2]).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }
}
