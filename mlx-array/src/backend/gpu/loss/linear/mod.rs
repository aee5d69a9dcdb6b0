//! The output projection fused with the softmax cross-entropy, and its
//! gradient, in two forms.
//!
//! **Separately** ([`linear_cross_entropy`], [`linear_cross_entropy_grad`]:
//! the loss alone, and the gradient of `linear_cross_entropy` when it is
//! differentiated), without ever holding the `[rows, V]` logits: as on the
//! CPU (`backend/cpu/loss.rs`), the classes are taken one chunk at a time,
//! each chunk's logits computed by the tiled matmul into one pooled scratch
//! buffer. The forward pass keeps per-row running statistics (max, sum of
//! exponentials, target logit, logit total) with an online logsumexp; the
//! backward pass recovers each row's logsumexp from its loss, turns every
//! chunk into `ct * (softmax - target distribution)` in place and
//! accumulates `dh += g @ w[chunk]` and `dw[chunk] = g^T @ h` with the
//! matmul: four products of the projection's size in all. At the reference
//! shape (2044 rows, 256 dims, 50257 classes in 25 chunks of 2052) on an
//! H100, a chunk's logits product takes 272 workgroups of 128 x 128 (two
//! per SM); `dh` and `dw` have only 128 and 132 64 x 64 output tiles, so
//! the matmul splits their depth into 5 and 4 slices (640 and 528
//! workgroups, see `matmul`'s split-K).
//!
//! **Together** ([`linear_cross_entropy_value_and_grad`], what a training
//! step's `linear_cross_entropy_sum` runs), in one pass over blocks of rows
//! as the CPU's one-pass kernel does: a block's logits over the whole
//! vocabulary (at most 256 MiB: two blocks of 1022 rows at the reference
//! shape), their statistics in one step (one workgroup per row), the
//! gradient in place (one invocation per logit), `dh[block] = g @ w` and
//! `dw (+)= g^T @ h[block]`: three products, no recomputed logits, and 7
//! dispatches a block (14 a step at the reference shape, against the two
//! passes' 8 a chunk, 200 a step). On an H100 a block's logits
//! product is 8 x 393 tiles of 128 x 128 (3,144 workgroups, ~12 waves of
//! two per SM); `dh[block]` (`[1022, 50257] @ [50257, 256]`, 16 tiles of
//! 128 x 128) is split into 15 slices of 3,360 classes (240 workgroups,
//! 15.7 MB of partial sums; `matmul::split_big`); `dw` (`[50257, 1022] @ [1022, 256]`) is 786 tiles of
//! 128 x 128. 158 GFLOP a step in products instead of 210.
//!
//! Everything is recorded into the eval's command encoder (and goes to the
//! GPU in chunks as the eval records, see `submission`).
//!
//! **Precision.** f32 and bf16 `h` and `w` are computed in f32 (bf16 has no
//! cooperative-matrix configuration on the H100's Vulkan driver, so it
//! gains nothing from staying bf16). f16 `h` and `w`, where the matmul's
//! cooperative kernel runs (tensor cores, or its plain fragments when
//! `MLX_GPU_TUNING=coopmat=plain`; `matmul::f16_f32_products`), stay f16 and every
//! product runs on it, as PyTorch's autocast does: the logits are f16 x f16
//! products accumulated and stored in f32 (the statistics, softmax and
//! gradient stay f32); the gradient `g` of the logits, already scaled by
//! the row cotangents (which carry the loss scale in f16 training), is
//! rounded to f16 by the gradient kernel into its own scratch, and `dh =
//! g @ w`, `dw = g^T @ h` accumulate in f32 into the f32 gradient buffer.
//! Elsewhere (no `shader-f16`, no cooperative matrices, `MLX_GPU_TUNING=coopmat=off`)
//! f16 is computed in f32 like bf16. The gradients are cast to the
//! operands' dtype at the end.
//!
//! Memory on the f16 path: `h` and `w` are used as they are (no f32 copies:
//! 51.5 MB less for the reference shape's `w`), and the f16 gradient takes
//! half the bytes of the f32 logits beside them (102.7 MB for a block of
//! 1022 rows x 50257 classes, on top of its 205.6 MB of logits; 8 MiB for
//! the two passes' default 16 MiB chunks).
//!
//! Design figures for the f16 one-pass products at the reference shape on
//! an H100 (estimates, not measured: no card was lent to this change), per
//! block of 1022 rows: the logits are 8 x 393 workgroups of the 128 x 128
//! cooperative tiling (128 invocations, 4 subgroups of 4 x 4 fragments,
//! 35,328 B of workgroup memory, 2 per SM by registers; its f32 rows of
//! 50,257 are not 16-byte aligned, so they leave through the staging
//! fragment), depth 256 in 8 staged slices;
//! `dh[block]` has 16 tiles of 128 x 128 and is split over the 50257
//! classes into 15 slices of 3,360 (240 workgroups of the 128 x 128
//! tiling, about two per SM; 15.7 MB of f32 partial sums); `dw` is 786 tiles of
//! 128 x 128 over a depth of 1022, added into the f32 gradient from the
//! second block on. Standalone, the same three products measured 32.7,
//! 5.9 (unsplit) and 59.4 TFLOP/s on the tensor-core kernel against 16.7,
//! 13.6 and 26.3 in f32 (BENCHMARKS.md, 2026-11-26); with `dh` split, all
//! three should run at 30-60 TFLOP/s: the step's 158 GFLOP of products in
//! ~3-5 ms (the whole f32 pass, products and statistics, took ~13 ms of a
//! 26 ms f32 step's GPU time).
//!
//! Targets out of range (which the CPU rejects at eval) give a NaN loss and
//! NaN gradient rows.

mod kernels;

use crate::backend::common::loss::{LceArgs, chunk_cols};
use crate::backend::gpu::codegen;
use crate::backend::gpu::device::context;
use crate::backend::gpu::elementwise::astype;
use crate::backend::gpu::matmul::{self, Destination};
use crate::backend::gpu::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};
use kernels::{
    column_mean, record_grad, resolve_targets, row_block_terms, row_terms, stats_source,
};
const OP: &str = "linear_cross_entropy";

/// Resolved target of a row whose target equals the ignore index.
const IGNORED: u32 = u32::MAX;

/// Shapes, operands and resolved targets shared by both passes.
struct Setup {
    rows: usize,
    dims: usize,
    vocab: usize,
    cols: usize,
    smoothing: f32,
    /// Whether `h` and `w` are f16 and the products run on the tensor-core
    /// kernel (f16 operands, f32 results; the gradient cast to f16 for
    /// its products), else f32 operands on the f32 kernel.
    half: bool,
    /// `h` as dense `[rows, dims]` of [`Setup::operands`].
    h: ArrayData,
    /// `w` as dense `[vocab, dims]` of [`Setup::operands`].
    w: ArrayData,
    /// Per row: its class, [`IGNORED`], or `IGNORED - 1` when out of range.
    tg: ArrayData,
    /// The GPU tuning the loss's entry point read, for its products.
    tuning: crate::settings::GpuTuning,
}

/// `x` as a dense f32 array.
fn f32_dense(x: &Operand<'_>) -> Result<ArrayData> {
    if x.dtype != Dtype::F32 {
        astype(x, Dtype::F32)
    } else {
        crate::backend::gpu::elementwise::dense(x)
    }
}

/// The view `[rows, cols]` of dense f32 `data` starting `at` elements in,
/// with the given strides.
fn view2(data: &ArrayData, at: usize, strides: [usize; 2]) -> ArrayData {
    data.view(
        vec![strides[0] as isize, strides[1] as isize],
        data.offset() + at,
    )
}

impl Setup {
    fn new(a: &LceArgs<'_>, op: &'static str) -> Result<Setup> {
        if !matches!(a.h.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(Error::eval(
                op,
                format!(
                    "hidden states and weight must be floating point, got {}",
                    a.h.dtype
                ),
            ));
        }
        let (t, t_dtype) = (&a.t.data, a.t.dtype);
        supported(t_dtype)?;
        if !matches!(t_dtype, Dtype::I32 | Dtype::U32) {
            return Err(Error::gpu(format!(
                "{op}: targets must be i32 or u32 on the GPU, got {t_dtype}"
            )));
        }
        let dims = *a.h.shape.last().expect("hidden states have a feature axis");
        let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
        let rows = size_of_shape(rows_shape);
        let vocab = a.w.shape[0];
        codegen::check_size(op, rows * dims, &[&a.h.data, &a.w.data, t])?;
        codegen::check_size(op, vocab * dims, &[])?;
        let c = context()?;
        let max_bytes = c
            .limits
            .max_storage_buffer_binding_size
            .min(c.limits.max_buffer_size) as usize;
        // A chunk of logits must fit one storage buffer (and 32-bit indices).
        let fit = (max_bytes.min(u32::MAX as usize / 2) / 4 / rows.max(1)).max(1);
        let cols = chunk_cols(rows, vocab, a.chunk).min(fit);
        // f16 operands stay f16 (no copies where already dense) when the
        // tensor-core kernel can multiply them; bf16 has no cooperative
        // matrix on the H100's driver and is computed in f32.
        let tuning = crate::settings::gpu_tuning();
        let half = a.h.dtype == Dtype::F16 && matmul::f16_f32_products(&tuning)?;
        let (h, w) = if half {
            (
                crate::backend::gpu::elementwise::dense(&a.h)?,
                crate::backend::gpu::elementwise::dense(&a.w)?,
            )
        } else {
            (f32_dense(&a.h)?, f32_dense(&a.w)?)
        };
        let tg = resolve_targets(t, rows_shape, t_dtype, vocab, a.ignore_index)?;
        Ok(Setup {
            rows,
            dims,
            vocab,
            cols,
            smoothing: a.label_smoothing,
            half,
            h,
            w,
            tg,
            tuning,
        })
    }

    /// The dtype `h` and `w` are held and multiplied in: f16 on the
    /// tensor-core path, else f32.
    fn operands(&self) -> Dtype {
        if self.half { Dtype::F16 } else { Dtype::F32 }
    }

    /// `data` as a 2-D operand of `shape`, of [`Setup::operands`].
    fn operand<'s>(&self, data: ArrayData, shape: &'s [usize]) -> Operand<'s> {
        Operand::new(data, shape, self.operands())
    }

    /// Records `to (+)= a @ b` into a dense f32 block: a product of f16
    /// operands on the tensor-core kernel with `half`, else of f32
    /// operands on the f32 kernel.
    fn product(&self, a: &Operand<'_>, b: &Operand<'_>, to: &Destination<'_>) -> Result<()> {
        if self.half {
            matmul::record_f16_f32(a, b, to, &self.tuning)
        } else {
            matmul::record(a, b, to, &self.tuning)
        }
    }

    /// Scratch for the gradient's products of `[rows, n]`: with `half`, an
    /// f16 copy of the gradient written by the gradient kernel (half the
    /// bytes of the f32 logits beside it); else none (the gradient
    /// overwrites the logits).
    fn grad_scratch(&self, rows: usize, n: usize) -> Result<Option<ArrayData>> {
        if self.half {
            Ok(Some(alloc(&[rows, n], Dtype::F16)?))
        } else {
            Ok(None)
        }
    }

    /// Records `x[.., ..n] = h @ w[c0..c0 + n]^T` into the dense `[rows, n]`
    /// scratch `x`.
    fn chunk_logits(&self, x: &ArrayData, c0: usize, n: usize) -> Result<()> {
        let (rows, dims) = (self.rows, self.dims);
        self.product(
            &self.operand(view2(&self.h, 0, [dims, 1]), &[rows, dims]),
            &self.operand(view2(&self.w, c0 * dims, [1, dims]), &[dims, n]),
            &Destination {
                data: x,
                shape: &[rows, n],
                offset: 0,
                accumulate: false,
                addend: None,
            },
        )
    }

    /// The chunks: `(first class, classes)`.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.vocab)
            .step_by(self.cols)
            .map(|c0| (c0, self.cols.min(self.vocab - c0)))
    }
}
/// Per-row cross-entropy of the logits `h @ w^T`, one chunk of classes at a
/// time: f32 losses of shape `h.shape[..-1]`.
pub fn linear_cross_entropy(a: &LceArgs<'_>) -> Result<ArrayData> {
    let st = Setup::new(a, OP)?;
    let rows = st.rows;
    let out = alloc(&a.h.shape[..a.h.shape.len() - 1], Dtype::F32)?;
    if rows == 0 {
        return Ok(out);
    }
    let x = alloc(&[rows, st.cols], Dtype::F32)?;
    let stats = alloc(&[rows, 4], Dtype::F32)?;
    let pipeline = context()?.pipeline("lce_stats", stats_source)?;
    for (c0, n) in st.chunks() {
        st.chunk_logits(&x, c0, n)?;
        let meta = [
            rows as u32,
            n as u32,
            c0 as u32,
            (c0 == 0) as u32,
            (c0 + n == st.vocab) as u32,
            st.vocab as u32,
            st.smoothing.to_bits(),
            0,
        ];
        crate::backend::gpu::dispatch::dispatch_groups(
            &pipeline,
            &meta,
            &[&x, &st.tg, &stats],
            &out,
            rows * 4,
            false,
            rows,
        )?;
    }
    Ok(out)
}
/// The gradients of [`linear_cross_entropy`] for row cotangents `ct` given
/// its f32 `loss`: one flat buffer of `a.h.dtype` holding `dh` (`h`'s shape)
/// followed by `dw` (`[V, D]`).
pub fn linear_cross_entropy_grad(
    a: &LceArgs<'_>,
    ct: &Operand<'_>,
    loss: &Operand<'_>,
) -> Result<ArrayData> {
    const GRAD: &str = "linear_cross_entropy_grad";
    supported(ct.dtype)?;
    let st = Setup::new(a, GRAD)?;
    let (rows, dims) = (st.rows, st.dims);
    let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
    let (hn, wn) = (rows * dims, st.vocab * dims);
    codegen::check_size(GRAD, hn + wn, &[&ct.data, &loss.data])?;
    let flat = alloc(&[hn + wn], Dtype::F32)?;
    if hn + wn > 0 {
        let ctv = f32_dense(&ct.with_shape(rows_shape))?;
        let lossv = f32_dense(&loss.with_shape(rows_shape))?;
        let w_mean = if st.smoothing > 0.0 {
            Some(column_mean(&st)?)
        } else {
            None
        };
        let terms = row_terms(&st, &lossv, &ctv, w_mean.as_ref())?;
        let x = alloc(&[rows, st.cols], Dtype::F32)?;
        let gh = st.grad_scratch(rows, st.cols)?;
        for (c0, n) in st.chunks() {
            st.chunk_logits(&x, c0, n)?;
            let meta = [
                rows as u32,
                n as u32,
                c0 as u32,
                st.smoothing.to_bits(),
                st.vocab as u32,
                0,
            ];
            let g = record_grad(&meta, &terms, &st.tg, &x, gh.as_ref(), rows * n)?;
            // dh (+)= g @ w[chunk]
            st.product(
                &st.operand(view2(g, 0, [n, 1]), &[rows, n]),
                &st.operand(view2(&st.w, c0 * dims, [dims, 1]), &[n, dims]),
                &Destination {
                    data: &flat,
                    shape: &[rows, dims],
                    offset: 0,
                    accumulate: c0 > 0,
                    addend: None,
                },
            )?;
            // dw[chunk] = g^T @ h
            st.product(
                &st.operand(view2(g, 0, [1, n]), &[n, rows]),
                &st.operand(view2(&st.h, 0, [dims, 1]), &[rows, dims]),
                &Destination {
                    data: &flat,
                    shape: &[n, dims],
                    offset: hn + c0 * dims,
                    accumulate: false,
                    addend: None,
                },
            )?;
        }
    }
    if a.h.dtype == Dtype::F32 {
        Ok(flat)
    } else {
        astype(&Operand::new(flat, &[hn + wn], Dtype::F32), a.h.dtype)
    }
}

/// Logits held at once by [`linear_cross_entropy_value_and_grad`]: a block
/// of rows over the whole vocabulary. 256 MiB is 0.3% of an H100's memory
/// and holds the reference shape's 2044 rows x 50257 classes in two blocks
/// of 1022 rows; smaller blocks would only cut the products into smaller,
/// less efficient pieces.
const BLOCK_LOGITS_BYTES: usize = 256 << 20;

/// The per-row losses of [`linear_cross_entropy`] and the gradients of
/// [`linear_cross_entropy_grad`] for row cotangents `ct`, in one pass: the
/// rows a block at a time ([`LceArgs::block_rows`], or blocks of at most
/// `BLOCK_LOGITS_BYTES` of logits), each block's logits over the whole
/// vocabulary computed once, reduced to the rows' losses, turned into the
/// gradient in place, then `dh[block] = g @ w` (split over the vocabulary,
/// see `matmul`'s split-K) and `dw (+)= g^T @ h[block]`. Three products of
/// the projection's size instead of the two passes' four, and 2 to a few
/// hundred dispatches fewer. Returns the f32 losses (`h.shape[..-1]`) and
/// one flat buffer of `a.h.dtype` holding `dh` then `dw`.
pub fn linear_cross_entropy_value_and_grad(
    a: &LceArgs<'_>,
    ct: &Operand<'_>,
) -> Result<(ArrayData, ArrayData)> {
    const BOTH: &str = "linear_cross_entropy_value_and_grad";
    supported(ct.dtype)?;
    let st = Setup::new(a, BOTH)?;
    let (rows, dims, vocab) = (st.rows, st.dims, st.vocab);
    let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
    let (hn, wn) = (rows * dims, vocab * dims);
    codegen::check_size(BOTH, hn + wn, &[&ct.data])?;
    let loss = alloc(rows_shape, Dtype::F32)?;
    let flat = alloc(&[hn + wn], Dtype::F32)?;
    let c = context()?;
    let max_bytes = c
        .limits
        .max_storage_buffer_binding_size
        .min(c.limits.max_buffer_size) as usize;
    // A block's logits fit one storage buffer and 32-bit indices (the
    // weight has at least one class: the op refuses an empty one).
    let fit = (BLOCK_LOGITS_BYTES.min(max_bytes).min(u32::MAX as usize / 2) / 4 / vocab).max(1);
    let most = if a.block_rows > 0 {
        a.block_rows.min(fit)
    } else {
        fit
    };
    // No rows: one empty block, whose `dw` product (of depth 0) writes zeros.
    let block = match rows {
        0 => 0,
        _ => rows.div_ceil(rows.div_ceil(most.min(rows))),
    };
    let starts: Vec<usize> = match rows {
        0 => vec![0],
        _ => (0..rows).step_by(block).collect(),
    };
    let ctv = f32_dense(&ct.with_shape(rows_shape))?;
    let w_mean = if st.smoothing > 0.0 {
        Some(column_mean(&st)?)
    } else {
        None
    };
    let x = alloc(&[block, vocab], Dtype::F32)?;
    let gh = st.grad_scratch(block, vocab)?;
    let stats = alloc(&[block, 4], Dtype::F32)?;
    let stats_kernel = c.pipeline("lce_stats", stats_source)?;
    for r0 in starts {
        let n = block.min(rows - r0);
        // x = h[block] @ w^T over every class.
        st.product(
            &st.operand(view2(&st.h, r0 * dims, [dims, 1]), &[n, dims]),
            &st.operand(view2(&st.w, 0, [1, dims]), &[dims, vocab]),
            &Destination {
                data: &x,
                shape: &[n, vocab],
                offset: 0,
                accumulate: false,
                addend: None,
            },
        )?;
        let meta = [
            n as u32,
            vocab as u32,
            0,
            1,
            1,
            vocab as u32,
            st.smoothing.to_bits(),
            r0 as u32,
        ];
        crate::backend::gpu::dispatch::dispatch_groups(
            &stats_kernel,
            &meta,
            &[&x, &st.tg, &stats],
            &loss,
            rows * 4,
            false,
            n,
        )?;
        let at = |d: &ArrayData| d.view(vec![1], d.offset() + r0);
        let terms = row_block_terms(&st, r0, n, &at(&loss), &at(&ctv), w_mean.as_ref())?;
        let meta = [
            n as u32,
            vocab as u32,
            0,
            st.smoothing.to_bits(),
            vocab as u32,
            r0 as u32,
        ];
        let g = record_grad(&meta, &terms, &st.tg, &x, gh.as_ref(), n * vocab)?;
        // dh[block] = g @ w
        st.product(
            &st.operand(view2(g, 0, [vocab, 1]), &[n, vocab]),
            &st.operand(view2(&st.w, 0, [dims, 1]), &[vocab, dims]),
            &Destination {
                data: &flat,
                shape: &[n, dims],
                offset: r0 * dims,
                accumulate: false,
                addend: None,
            },
        )?;
        // dw (+)= g^T @ h[block]
        st.product(
            &st.operand(view2(g, 0, [1, vocab]), &[vocab, n]),
            &st.operand(view2(&st.h, r0 * dims, [dims, 1]), &[n, dims]),
            &Destination {
                data: &flat,
                shape: &[vocab, dims],
                offset: hn,
                accumulate: r0 > 0,
                addend: None,
            },
        )?;
    }
    Ok((loss, finish_grads(flat, hn + wn, a.h.dtype)?))
}

/// The flat f32 gradients as `dtype`.
fn finish_grads(flat: ArrayData, n: usize, dtype: Dtype) -> Result<ArrayData> {
    if dtype == Dtype::F32 {
        Ok(flat)
    } else {
        astype(&Operand::new(flat, &[n], Dtype::F32), dtype)
    }
}
