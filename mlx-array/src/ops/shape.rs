//! Shape ops: reshape, transpose, broadcast, slicing, joining and splitting.

use crate::primitives::indexing::{Concatenate, Pad, SliceUpdate};
use crate::primitives::view::{BroadcastTo, Contiguous, Reshape, Slice, Transpose};
use crate::shape::{normalize_axes, normalize_axis, size_of_shape};
use crate::{Array, Dtype, Error, Result};

/// Gives `x` a new shape with the same elements; one entry may be -1 (inferred).
///
/// ```
/// use mlx_array::{arange, Dtype};
/// let x = arange(0.0, 6.0, 1.0, Dtype::F32).unwrap().reshape(&[2, -1]).unwrap();
/// assert_eq!(x.shape(), &[2, 3]);
/// ```
pub fn reshape(x: &Array, shape: &[i64]) -> Result<Array> {
    let mut out = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &d) in shape.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            d if d >= 0 => out.push(d as usize),
            _ => {
                return Err(Error::shape(
                    "reshape",
                    format!("invalid target shape {shape:?}"),
                ));
            }
        }
    }
    let known = size_of_shape(&out);
    if let Some(i) = infer {
        if known == 0 || !x.size().is_multiple_of(known) {
            return Err(Error::shape(
                "reshape",
                format!("cannot reshape {:?} to {shape:?}", x.shape()),
            ));
        }
        out[i] = x.size() / known;
    }
    if size_of_shape(&out) != x.size() {
        return Err(Error::shape(
            "reshape",
            format!(
                "cannot reshape {:?} ({} elements) to {shape:?}",
                x.shape(),
                x.size()
            ),
        ));
    }
    if out == x.shape() {
        return Ok(x.clone());
    }
    Ok(Array::from_primitive(
        Reshape,
        vec![x.clone()],
        out,
        x.dtype(),
    ))
}

/// Reshapes to a shape given in `usize` (no inference).
pub fn reshape_to(x: &Array, shape: &[usize]) -> Result<Array> {
    reshape(x, &shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

/// Permutes axes; an empty `axes` reverses them (as `x.T`).
pub fn transpose(x: &Array, axes: &[i32]) -> Result<Array> {
    let n = x.ndim();
    let perm: Vec<usize> = if axes.is_empty() {
        (0..n).rev().collect()
    } else {
        if axes.len() != n {
            return Err(Error::shape(
                "transpose",
                format!("{} axes given for an array with {n} dimensions", axes.len()),
            ));
        }
        let mut p = Vec::with_capacity(n);
        for &a in axes {
            let a = normalize_axis("transpose", a, n)?;
            if p.contains(&a) {
                return Err(Error::invalid(
                    "transpose",
                    format!("axis {a} is repeated in {axes:?}"),
                ));
            }
            p.push(a);
        }
        p
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x.clone());
    }
    let shape = perm.iter().map(|&p| x.shape()[p]).collect();
    Ok(Array::from_primitive(
        Transpose(perm),
        vec![x.clone()],
        shape,
        x.dtype(),
    ))
}

/// Swaps two axes.
pub fn swapaxes(x: &Array, a: i32, b: i32) -> Result<Array> {
    let (a, b) = (
        normalize_axis("swapaxes", a, x.ndim())?,
        normalize_axis("swapaxes", b, x.ndim())?,
    );
    let mut perm: Vec<i32> = (0..x.ndim() as i32).collect();
    perm.swap(a, b);
    transpose(x, &perm)
}

/// Inserts size-1 axes at the given positions of the result.
pub fn expand_dims(x: &Array, axes: &[i32]) -> Result<Array> {
    let n = x.ndim() + axes.len();
    let axes = normalize_axes("expand_dims", axes, n)?;
    let mut shape = Vec::with_capacity(n);
    let mut src = x.shape().iter();
    for i in 0..n {
        shape.push(if axes.contains(&i) {
            1
        } else {
            *src.next().expect("counted")
        });
    }
    reshape_to(x, &shape)
}

/// Removes size-1 axes (all of them when `axes` is empty).
pub fn squeeze(x: &Array, axes: &[i32]) -> Result<Array> {
    let axes = if axes.is_empty() {
        (0..x.ndim()).filter(|&i| x.shape()[i] == 1).collect()
    } else {
        normalize_axes("squeeze", axes, x.ndim())?
    };
    for &a in &axes {
        if x.shape()[a] != 1 {
            return Err(Error::shape(
                "squeeze",
                format!(
                    "axis {a} of shape {:?} has size {}, not 1",
                    x.shape(),
                    x.shape()[a]
                ),
            ));
        }
    }
    let shape: Vec<usize> = (0..x.ndim())
        .filter(|i| !axes.contains(i))
        .map(|i| x.shape()[i])
        .collect();
    reshape_to(x, &shape)
}

/// Broadcasts to `shape` under NumPy rules (a view, no copy).
pub fn broadcast_to(x: &Array, shape: &[usize]) -> Result<Array> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    let b = crate::shape::broadcast_shapes("broadcast_to", x.shape(), shape)?;
    if b != shape {
        return Err(Error::shape(
            "broadcast_to",
            format!("cannot broadcast {:?} to {shape:?}", x.shape()),
        ));
    }
    Ok(Array::from_primitive(
        BroadcastTo,
        vec![x.clone()],
        shape.to_vec(),
        x.dtype(),
    ))
}

/// Merges axes `start..=end` into one.
pub fn flatten(x: &Array, start: i32, end: i32) -> Result<Array> {
    if x.ndim() == 0 {
        return reshape_to(x, &[1]);
    }
    let (s, e) = (
        normalize_axis("flatten", start, x.ndim())?,
        normalize_axis("flatten", end, x.ndim())?,
    );
    if s > e {
        return Err(Error::invalid(
            "flatten",
            format!("start axis {s} is after end axis {e}"),
        ));
    }
    let mut shape = x.shape()[..s].to_vec();
    shape.push(x.shape()[s..=e].iter().product());
    shape.extend_from_slice(&x.shape()[e + 1..]);
    reshape_to(x, &shape)
}

/// A dense row-major copy when `x` is a strided view, else `x` itself once evaluated.
pub fn contiguous(x: &Array) -> Result<Array> {
    Ok(Array::from_primitive(
        Contiguous,
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    ))
}

/// One axis of a slice: Python's `start:stop:step`, with `None` for an open end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceArg {
    /// First index (negative counts from the end); `None` for the start (or end when step < 0).
    pub start: Option<i64>,
    /// Index one past the last (negative counts from the end); `None` for the open end.
    pub stop: Option<i64>,
    /// Step, non-zero.
    pub step: i64,
}

impl SliceArg {
    /// The whole axis, `:`.
    pub const FULL: SliceArg = SliceArg {
        start: None,
        stop: None,
        step: 1,
    };
    /// `start:stop`.
    pub fn range(start: i64, stop: i64) -> SliceArg {
        SliceArg {
            start: Some(start),
            stop: Some(stop),
            step: 1,
        }
    }
    /// `start:`.
    pub fn from(start: i64) -> SliceArg {
        SliceArg {
            start: Some(start),
            stop: None,
            step: 1,
        }
    }
    /// `:stop`.
    pub fn to(stop: i64) -> SliceArg {
        SliceArg {
            start: None,
            stop: Some(stop),
            step: 1,
        }
    }
    /// The same slice with another step.
    pub fn step(self, step: i64) -> SliceArg {
        SliceArg { step, ..self }
    }

    /// Resolves against an axis of `len`: (first index, count) as Python does.
    fn resolve(&self, len: usize) -> (usize, usize) {
        let n = len as i64;
        let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
        let norm = |v: i64| if v < 0 { v + n } else { v };
        if self.step > 0 {
            let start = self.start.map_or(0, |s| clamp(norm(s), 0, n));
            let stop = self.stop.map_or(n, |s| clamp(norm(s), 0, n));
            let count = if stop > start {
                (stop - start + self.step - 1) / self.step
            } else {
                0
            };
            (start as usize, count as usize)
        } else {
            let start = self.start.map_or(n - 1, |s| clamp(norm(s), -1, n - 1));
            let stop = self.stop.map_or(-1, |s| clamp(norm(s), -1, n - 1));
            let count = if start > stop {
                (start - stop - self.step - 1) / -self.step
            } else {
                0
            };
            (start.max(0) as usize, count as usize)
        }
    }
}

/// Python-style slicing of the leading axes (`x[a:b:c, d:e]`); missing axes are whole.
///
/// ```
/// use mlx_array::{arange, Dtype, SliceArg};
/// let x = arange(0.0, 10.0, 1.0, Dtype::I32).unwrap();
/// let y = x.slice(&[SliceArg::range(1, 8).step(3)]).unwrap();
/// assert_eq!(y.to_vec::<i32>().unwrap(), vec![1, 4, 7]);
/// ```
pub fn slice(x: &Array, args: &[SliceArg]) -> Result<Array> {
    if args.len() > x.ndim() {
        return Err(Error::shape(
            "slice",
            format!(
                "{} slices for an array with {} dimensions",
                args.len(),
                x.ndim()
            ),
        ));
    }
    let (mut start, mut step, mut shape) = (vec![], vec![], vec![]);
    for (i, &len) in x.shape().iter().enumerate() {
        let a = args.get(i).copied().unwrap_or(SliceArg::FULL);
        if a.step == 0 {
            return Err(Error::invalid("slice", format!("step of axis {i} is zero")));
        }
        let (s, n) = a.resolve(len);
        start.push(s);
        step.push(a.step as isize);
        shape.push(n);
    }
    if shape == x.shape() && step.iter().all(|&s| s == 1) {
        return Ok(x.clone());
    }
    Ok(Array::from_primitive(
        Slice { start, step },
        vec![x.clone()],
        shape,
        x.dtype(),
    ))
}

/// A copy of `x` with the window `x[args]` replaced by `update` (broadcast to
/// the window's shape): Python's `x[args] = update`, without mutation.
pub fn slice_update(x: &Array, update: &Array, args: &[SliceArg]) -> Result<Array> {
    let window = slice(x, args)?;
    let upd = update.astype(x.dtype())?.broadcast_to(window.shape())?;
    let (mut start, mut step) = (vec![], vec![]);
    for (i, &len) in x.shape().iter().enumerate() {
        let a = args.get(i).copied().unwrap_or(SliceArg::FULL);
        start.push(a.resolve(len).0);
        step.push(a.step as isize);
    }
    slice_update_raw(x, &upd, &start, &step)
}

/// [`slice_update`] with the window already resolved to starts and steps.
pub(crate) fn slice_update_raw(
    x: &Array,
    update: &Array,
    start: &[usize],
    step: &[isize],
) -> Result<Array> {
    let prim = SliceUpdate {
        start: start.to_vec(),
        step: step.to_vec(),
    };
    Ok(Array::from_primitive(
        prim,
        vec![x.clone(), update.astype(x.dtype())?],
        x.shape().to_vec(),
        x.dtype(),
    ))
}

/// `x[start:stop]` along one axis.
pub fn slice_axis(x: &Array, axis: i32, start: i64, stop: i64) -> Result<Array> {
    let a = normalize_axis("slice_axis", axis, x.ndim())?;
    let mut args = vec![SliceArg::FULL; a + 1];
    args[a] = SliceArg::range(start, stop);
    slice(x, &args)
}

/// Joins arrays along an existing axis (dtypes promoted).
pub fn concatenate(xs: &[Array], axis: i32) -> Result<Array> {
    let first = xs
        .first()
        .ok_or_else(|| Error::invalid("concatenate", "no arrays given"))?;
    let ax = normalize_axis("concatenate", axis, first.ndim())?;
    let mut dtype = first.dtype();
    let mut shape = first.shape().to_vec();
    shape[ax] = 0;
    for x in xs {
        let same = x.ndim() == first.ndim()
            && x.shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .all(|(i, (a, b))| i == ax || a == b);
        if !same {
            return Err(Error::shape(
                "concatenate",
                format!(
                    "shape {:?} does not match {:?} outside axis {ax}",
                    x.shape(),
                    first.shape()
                ),
            ));
        }
        shape[ax] += x.shape()[ax];
        dtype = Dtype::promote(dtype, x.dtype());
    }
    let inputs = xs
        .iter()
        .map(|x| x.astype(dtype))
        .collect::<Result<Vec<_>>>()?;
    if inputs.len() == 1 {
        return Ok(inputs[0].clone());
    }
    Ok(Array::from_primitive(Concatenate(ax), inputs, shape, dtype))
}

/// Joins arrays of one shape along a new axis.
pub fn stack(xs: &[Array], axis: i32) -> Result<Array> {
    let first = xs
        .first()
        .ok_or_else(|| Error::invalid("stack", "no arrays given"))?;
    let expanded = xs
        .iter()
        .map(|x| {
            if x.shape() != first.shape() {
                return Err(Error::shape(
                    "stack",
                    format!("shape {:?} differs from {:?}", x.shape(), first.shape()),
                ));
            }
            expand_dims(x, &[axis])
        })
        .collect::<Result<Vec<_>>>()?;
    concatenate(&expanded, axis)
}

/// Splits into `sections` equal parts along `axis`.
pub fn split(x: &Array, sections: usize, axis: i32) -> Result<Vec<Array>> {
    let a = normalize_axis("split", axis, x.ndim())?;
    let len = x.shape()[a];
    if sections == 0 || !len.is_multiple_of(sections) {
        return Err(Error::shape(
            "split",
            format!("axis {a} of size {len} does not split into {sections} equal parts"),
        ));
    }
    let step = len / sections;
    let at: Vec<usize> = (1..sections).map(|i| i * step).collect();
    split_at(x, &at, axis)
}

/// Splits along `axis` before each of the given indices.
pub fn split_at(x: &Array, indices: &[usize], axis: i32) -> Result<Vec<Array>> {
    let a = normalize_axis("split", axis, x.ndim())?;
    let len = x.shape()[a];
    let mut bounds = vec![0];
    bounds.extend(indices.iter().map(|&i| i.min(len)));
    bounds.push(len);
    bounds
        .windows(2)
        .map(|w| slice_axis(x, a as i32, w[0] as i64, w[1].max(w[0]) as i64))
        .collect()
}

/// Pads every axis with `(before, after)` copies of `value`.
pub fn pad(x: &Array, widths: &[(usize, usize)], value: f64) -> Result<Array> {
    if widths.len() != x.ndim() {
        return Err(Error::shape(
            "pad",
            format!(
                "{} pad widths for an array with {} dimensions",
                widths.len(),
                x.ndim()
            ),
        ));
    }
    let shape = x
        .shape()
        .iter()
        .zip(widths)
        .map(|(&d, &(l, h))| d + l + h)
        .collect();
    let low = widths.iter().map(|w| w.0).collect();
    Ok(Array::from_primitive(
        Pad { low, value },
        vec![x.clone()],
        shape,
        x.dtype(),
    ))
}

impl Array {
    /// See [`reshape`].
    pub fn reshape(&self, shape: &[i64]) -> Result<Array> {
        reshape(self, shape)
    }
    /// See [`transpose`].
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        transpose(self, axes)
    }
    /// Reverses the axes (`x.T`).
    pub fn t(&self) -> Result<Array> {
        transpose(self, &[])
    }
    /// See [`swapaxes`].
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        swapaxes(self, a, b)
    }
    /// See [`expand_dims`].
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        expand_dims(self, axes)
    }
    /// See [`squeeze`].
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        squeeze(self, axes)
    }
    /// See [`broadcast_to`].
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array> {
        broadcast_to(self, shape)
    }
    /// See [`flatten`].
    pub fn flatten(&self, start: i32, end: i32) -> Result<Array> {
        flatten(self, start, end)
    }
    /// See [`contiguous`].
    pub fn contiguous(&self) -> Result<Array> {
        contiguous(self)
    }
    /// See [`slice`](fn@slice).
    pub fn slice(&self, args: &[SliceArg]) -> Result<Array> {
        slice(self, args)
    }
    /// See [`slice_axis`].
    pub fn slice_axis(&self, axis: i32, start: i64, stop: i64) -> Result<Array> {
        slice_axis(self, axis, start, stop)
    }
    /// See [`slice_update`].
    pub fn slice_update(&self, update: &Array, args: &[SliceArg]) -> Result<Array> {
        slice_update(self, update, args)
    }
    /// See [`split`].
    pub fn split(&self, sections: usize, axis: i32) -> Result<Vec<Array>> {
        split(self, sections, axis)
    }
    /// See [`pad`].
    pub fn pad(&self, widths: &[(usize, usize)], value: f64) -> Result<Array> {
        pad(self, widths, value)
    }
}
