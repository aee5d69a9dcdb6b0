//! safetensors files: save and load named arrays in the format MLX and
//! PyTorch read (`mx.load`, `safetensors.torch.load_file`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, SafeTensors, View};

use crate::{Array, ArrayData, Dtype, Error, Result, Tree};

fn to_st(d: Dtype) -> StDtype {
    match d {
        Dtype::Bool => StDtype::BOOL,
        Dtype::U32 => StDtype::U32,
        Dtype::I32 => StDtype::I32,
        Dtype::I64 => StDtype::I64,
        Dtype::F16 => StDtype::F16,
        Dtype::BF16 => StDtype::BF16,
        Dtype::F32 => StDtype::F32,
    }
}

fn from_st(d: StDtype) -> Option<Dtype> {
    Some(match d {
        StDtype::BOOL => Dtype::Bool,
        StDtype::U32 => Dtype::U32,
        StDtype::I32 => Dtype::I32,
        StDtype::I64 => Dtype::I64,
        StDtype::F16 => Dtype::F16,
        StDtype::BF16 => Dtype::BF16,
        StDtype::F32 => Dtype::F32,
        _ => return None,
    })
}

/// An evaluated, contiguous array seen as safetensors bytes.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: ArrayData,
    len: usize,
}

impl View for &Bytes {
    fn dtype(&self) -> StDtype {
        to_st(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(
            self.data
                .as_bytes(self.dtype, self.len / self.dtype.size_of()),
        )
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes named arrays (evaluating them, and copying those on the GPU to the
/// host) to a safetensors file, atomically: the file appears complete under
/// its name or not at all.
pub fn save_safetensors(
    path: impl AsRef<Path>,
    arrays: &[(String, Array)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    // Arrays on the GPU come back to the host (the copy is placed on the CPU
    // whatever the default device).
    let contiguous = crate::device::with_device(crate::Device::Cpu, || {
        arrays
            .iter()
            .map(|(_, a)| a.to_device(crate::Device::Cpu).contiguous())
            .collect::<Result<Vec<_>>>()
    })?;
    crate::eval(&contiguous)?;
    let bytes = arrays
        .iter()
        .zip(&contiguous)
        .map(|((name, a), c)| {
            Ok((
                name.clone(),
                Bytes {
                    dtype: a.dtype(),
                    shape: a.shape().to_vec(),
                    data: c.data()?,
                    len: a.nbytes(),
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<(String, &Bytes)> = bytes.iter().map(|(n, b)| (n.clone(), b)).collect();
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    safetensors::serialize_to_file(views, metadata, &tmp).map_err(|e| Error::Format {
        path: tmp.display().to_string(),
        message: e.to_string(),
    })?;
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
}

/// What [`save_safetensors_streamed`] writes of one array: its name, shape
/// and dtype, declared before its values exist.
pub type TensorSpec = (String, Vec<usize>, Dtype);

/// Writes a safetensors file one array at a time: the header comes from
/// `specs`, then each array is made by `produce` (given its name),
/// evaluated, written and dropped before the next is made, so the file
/// never needs more than one of them in memory. The arrays are made in the
/// file's order (by dtype, then name, as safetensors lays them out, so the
/// file is the one [`save_safetensors`] writes of the same arrays); with
/// `path` `None` they are made and evaluated in that order and nothing is
/// written (the ranks that take part in a collective save without writing
/// it). Atomic like [`save_safetensors`]. An array whose shape or dtype is
/// not its spec's is an error.
pub fn save_safetensors_streamed(
    path: Option<&Path>,
    specs: &[TensorSpec],
    metadata: Option<HashMap<String, String>>,
    mut produce: impl FnMut(&str) -> Result<Array>,
) -> Result<()> {
    let mut order: Vec<&TensorSpec> = specs.iter().collect();
    order.sort_by(|(ln, _, ld), (rn, _, rd)| to_st(*rd).cmp(&to_st(*ld)).then(ln.cmp(rn)));
    let format = |path: &Path, message: String| Error::Format {
        path: path.display().to_string(),
        message,
    };
    let mut file = match path {
        Some(path) => {
            let mut offset = 0usize;
            let mut infos = Vec::with_capacity(order.len());
            for (name, shape, dtype) in &order {
                let end = shape
                    .iter()
                    .try_fold(dtype.size_of(), |a, &d| a.checked_mul(d))
                    .and_then(|n| n.checked_add(offset))
                    .ok_or_else(|| format(path, format!("`{name}` is too large")))?;
                let info = safetensors::tensor::TensorInfo {
                    dtype: to_st(*dtype),
                    shape: shape.clone(),
                    data_offsets: (offset, end),
                };
                offset = end;
                infos.push((name.clone(), info));
            }
            let header = safetensors::tensor::Metadata::new(metadata, infos)
                .and_then(|m| serde_json::to_vec(&m).map_err(Into::into))
                .map_err(|e| format(path, e.to_string()))?;
            let mut header = header;
            header.resize(header.len().next_multiple_of(8), b' ');
            let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
            let f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
            let mut w = std::io::BufWriter::new(f);
            let start = [&(header.len() as u64).to_le_bytes()[..], &header[..]].concat();
            std::io::Write::write_all(&mut w, &start).map_err(|e| io_err(&tmp, e))?;
            Some((w, tmp, path))
        }
        None => None,
    };
    let written = (|| {
        for (name, shape, dtype) in order {
            let a = produce(name)?;
            if a.shape() != shape.as_slice() || a.dtype() != *dtype {
                return Err(Error::Invalid {
                    op: "save_safetensors_streamed",
                    message: format!(
                        "`{name}` was declared {dtype:?} {shape:?} and made {:?} {:?}",
                        a.dtype(),
                        a.shape()
                    ),
                });
            }
            let Some((w, tmp, _)) = file.as_mut() else {
                crate::eval(std::slice::from_ref(&a))?;
                continue;
            };
            let c = crate::device::with_device(crate::Device::Cpu, || {
                a.to_device(crate::Device::Cpu).contiguous()
            })?;
            crate::eval(std::slice::from_ref(&c))?;
            let bytes = c.data()?;
            std::io::Write::write_all(w, bytes.as_bytes(*dtype, a.size()))
                .map_err(|e| io_err(tmp, e))?;
        }
        if let Some((w, tmp, _)) = file.as_mut() {
            std::io::Write::flush(w).map_err(|e| io_err(tmp, e))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        if let Some((_, tmp, _)) = file {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(e);
    }
    if let Some((w, tmp, path)) = file {
        drop(w);
        std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
    }
    Ok(())
}

/// Writes a tree with dotted names (see [`save_safetensors`]).
pub fn save_tree(
    path: impl AsRef<Path>,
    tree: &Tree,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    save_safetensors(path, &tree.flatten(), metadata)
}

/// Reads every array of a safetensors file (copied into array buffers) and its metadata.
pub fn load_safetensors(
    path: impl AsRef<Path>,
) -> Result<(BTreeMap<String, Array>, HashMap<String, String>)> {
    load_safetensors_parts(path, |_, _| Part::Whole)
}

/// Which part of a tensor [`load_safetensors_parts`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The whole tensor.
    Whole,
    /// Block `index` of `parts` equal blocks along `axis` (a tensor-parallel
    /// rank's shard), read alone from the file.
    Block {
        /// The axis cut.
        axis: usize,
        /// Which block.
        index: usize,
        /// How many blocks.
        parts: usize,
    },
    /// Not read at all.
    Skip,
}

/// Reads the tensors of a safetensors file, each as much of it as `part`
/// says given its name and shape: a process that holds a shard of a model
/// reads only that shard's bytes (the file is memory-mapped), never the
/// whole tensor. A block that does not divide the axis evenly is an error
/// naming the tensor.
pub fn load_safetensors_parts(
    path: impl AsRef<Path>,
    part: impl Fn(&str, &[usize]) -> Part,
) -> Result<(BTreeMap<String, Array>, HashMap<String, String>)> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    // SAFETY: the mapping is read-only and dropped before returning; the
    // contents are validated by the safetensors parser and copied out.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
    let fmt = |message: String| Error::Format {
        path: path.display().to_string(),
        message,
    };
    let (_, meta) = SafeTensors::read_metadata(&map).map_err(|e| fmt(e.to_string()))?;
    let st = SafeTensors::deserialize(&map).map_err(|e| fmt(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st(view.dtype()).ok_or_else(|| {
            fmt(format!(
                "tensor `{name}` has unsupported dtype {:?}",
                view.dtype()
            ))
        })?;
        let full = view.shape().to_vec();
        // A dimension of 0 makes any other dimensions valid to the parser
        // (there are no bytes to hold), but strides and block offsets
        // multiply them: [0, 2^40, 2^40] overflowed, a panic, before.
        let span = full
            .iter()
            .try_fold(dtype.size_of(), |n, &d| n.checked_mul(d.max(1)))
            .filter(|&n| n <= isize::MAX as usize);
        if span.is_none() {
            return Err(fmt(format!(
                "tensor `{name}` of shape {full:?} has dimensions whose product overflows"
            )));
        }
        let bytes = view.data();
        let (shape, chunks) = match part(&name, &full) {
            Part::Skip => continue,
            Part::Whole => (full.clone(), vec![bytes]),
            Part::Block { axis, index, parts } => {
                if axis >= full.len() || parts == 0 || index >= parts || full[axis] % parts != 0 {
                    return Err(fmt(format!(
                        "tensor `{name}` of shape {full:?} has no block {index} of {parts} along axis {axis}"
                    )));
                }
                let len = full[axis] / parts;
                let inner: usize = full[axis + 1..].iter().product::<usize>() * dtype.size_of();
                let outer: usize = full[..axis].iter().product();
                let chunks = (0..outer)
                    .map(|o| {
                        let start = (o * full[axis] + index * len) * inner;
                        &bytes[start..start + len * inner]
                    })
                    .collect();
                let mut shape = full.clone();
                shape[axis] = len;
                (shape, chunks)
            }
        };
        let mut data = ArrayData::alloc(&shape, dtype);
        let n: usize = chunks.iter().map(|c| c.len()).sum();
        let dst = data.as_mut_slice::<u8>(n);
        let mut at = 0;
        for c in chunks {
            dst[at..at + c.len()].copy_from_slice(c);
            at += c.len();
        }
        out.insert(name, Array::from_data(data, shape, dtype));
    }
    let metadata = meta.metadata().clone().unwrap_or_default();
    Ok((out, metadata))
}

/// Reads a safetensors file into a tree (dotted names nest).
pub fn load_tree(path: impl AsRef<Path>) -> Result<Tree> {
    Tree::unflatten(load_safetensors(path)?.0)
}
