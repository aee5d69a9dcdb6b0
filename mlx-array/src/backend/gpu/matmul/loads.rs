//! How the kernels stage an operand's depth slice from global memory:
//! which operands may be read a whole vector at a time (chosen on the host,
//! part of the pipeline key), and where each invocation's loads fall in the
//! slice, in the operand and in workgroup memory (shared by both kernel
//! families' generators, [`super::coop`] and [`super::tiled`]).
//!
//! A vector load reads `width` consecutive elements along the operand's
//! contiguous dimension (the one with stride 1): a `vec4<f32>` in the f32
//! kernel, two `vec4<f16>` (16 bytes) in the cooperative one. It needs
//! every vector the kernel reads to start at a multiple of `width`
//! elements and to hold elements of one row (or column) of the product, so
//! that it is either wholly inside the product or wholly outside
//! ([`aligned`]); otherwise the operand is staged one element per load
//! (the scalar path).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::View;
use crate::data::ArrayData;

/// Which operands a product stages with vector loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct VecLoads {
    /// `a` is read `width` elements at a time.
    pub a: bool,
    /// `b` is read `width` elements at a time.
    pub b: bool,
}

/// One operand of a product as [`aligned`] judges it.
pub(super) struct OperandLayout<'a> {
    /// Its first element in its buffer.
    pub offset: usize,
    /// The stride between rows of the matrix.
    pub row_stride: isize,
    /// The stride between its columns.
    pub col_stride: isize,
    /// Its rows and columns in the product (`m x k` for `a`, `k x n` for `b`).
    pub rows: usize,
    /// See `rows`.
    pub cols: usize,
    /// Read by columns (the row stride is the unit one, [`super::View`]).
    pub by_cols: bool,
    /// The strides of the batch dimensions `dims` (those of the dispatch,
    /// split-K's depth slices included).
    pub batch_strides: &'a [isize],
}

/// Whether `x` can be staged `width` elements at a time along its
/// contiguous dimension: it is not empty (whose buffer may be shorter
/// than one vector, the least a vector binding takes), that dimension's
/// stride is 1 and its extent in the product a multiple of `width`, and
/// the element offset, the other
/// matrix stride (the leading dimension) and the stride of every batch
/// dimension longer than 1 (of `dims`) are multiples of `width`. Then
/// every vector starts at a multiple of `width` (a `vec4`'s own alignment
/// in the buffer) and lies wholly inside or wholly outside the product's
/// rows and columns, which the kernels' bounds checks test at its first
/// element.
pub(super) fn aligned(width: usize, x: &OperandLayout<'_>, dims: &[usize]) -> bool {
    let (unit, lead, extent) = if x.by_cols {
        (x.row_stride, x.col_stride, x.rows)
    } else {
        (x.col_stride, x.row_stride, x.cols)
    };
    let w = width as isize;
    x.rows > 0
        && x.cols > 0
        && unit == 1
        && extent.is_multiple_of(width)
        && x.offset.is_multiple_of(width)
        && lead.rem_euclid(w) == 0
        && dims
            .iter()
            .zip(x.batch_strides)
            .all(|(&d, s)| d == 1 || s.rem_euclid(w) == 0)
}

/// Which of `a` and `b` (read as `view`, the product `[m, k] @ [k, n]`
/// with `dims` batch dimensions and each operand's `batch_strides` for
/// them) take vector loads of `width`, counted in
/// [`vector_operand_count`].
pub(super) fn choose(
    width: usize,
    view: View,
    [a, b]: [&ArrayData; 2],
    [m, n, k]: [usize; 3],
    dims: &[usize],
    batch_strides: [&[isize]; 2],
) -> VecLoads {
    let layout = |x: &ArrayData, rows, cols, by_cols, batch_strides| {
        let st = x.strides();
        let nd = st.len();
        OperandLayout {
            offset: x.offset(),
            row_stride: st[nd - 2],
            col_stride: st[nd - 1],
            rows,
            cols,
            by_cols,
            batch_strides,
        }
    };
    let loads = VecLoads {
        a: aligned(width, &layout(a, m, k, view.a_cols, batch_strides[0]), dims),
        b: aligned(width, &layout(b, k, n, view.b_cols, batch_strides[1]), dims),
    };
    VECTOR_OPERANDS.fetch_add(
        usize::from(loads.a) + usize::from(loads.b),
        Ordering::Relaxed,
    );
    loads
}

/// Operands staged with vector loads since the process started.
static VECTOR_OPERANDS: AtomicUsize = AtomicUsize::new(0);

/// Operands of GPU matrix products staged with vector loads since the
/// process started (0, 1 or 2 per product), for tests that check which
/// path a product took.
pub fn vector_operand_count() -> usize {
    VECTOR_OPERANDS.load(Ordering::Relaxed)
}

/// One operand's staged slice, as the generators write its loads: the
/// slice is `extent` places of the tile (rows of `a`, columns of `b`) by
/// `depth`, read `width` elements at a time (1: the scalar path) by
/// `invocations` invocations, with loads running along the operand's
/// contiguous dimension (consecutive invocations, consecutive addresses).
/// Names are of WGSL `let`s the kernel has in scope.
pub(super) struct Slice<'a> {
    /// Places of the tile beside the depth.
    pub extent: usize,
    /// Depth of the slice.
    pub depth: usize,
    /// Elements per load.
    pub width: usize,
    /// Invocations of the workgroup.
    pub invocations: usize,
    /// Contiguous along the tile's places (else along the depth).
    pub along_places: bool,
    /// The operand's extent along the places (`m` or `n`).
    pub limit: &'a str,
    /// The tile's first place (`row_base` or `col_base`).
    pub base: &'a str,
    /// The operand's element offset in this batch (`ao` or `bo`).
    pub offset: &'a str,
    /// Its stride along the places and along the depth (`i32`s).
    pub place_stride: &'a str,
    /// See `place_stride`.
    pub depth_stride: &'a str,
    /// Staged element `(p, kk)` is at `shared_base + p * shared_place +
    /// kk * shared_depth` of the workgroup array.
    pub shared_base: &'a str,
    /// See `shared_base`.
    pub shared_place: usize,
    /// See `shared_base`.
    pub shared_depth: usize,
}

impl Slice<'_> {
    /// Loads per invocation and slice.
    pub fn loads(&self) -> usize {
        let elements = self.extent * self.depth;
        debug_assert!(elements.is_multiple_of(self.width * self.invocations));
        elements / (self.width * self.invocations)
    }

    /// WGSL `let`s of load `q`: `p`, `kk` (its first element's place and
    /// depth in the slice).
    ///
    /// Consecutive invocations take consecutive vectors along the
    /// contiguous dimension, `run` of them before moving to the next
    /// place (or depth) across it: a whole staged row's worth where the
    /// vector's elements land side by side in workgroup memory (the
    /// scalar path's order), else [`TRANSPOSING_RUN`].
    pub fn locate(&self, q: usize) -> String {
        let w = self.width;
        // Vectors along the contiguous dimension, and positions across it.
        let (along, across) = if self.along_places {
            (self.extent / w, self.depth)
        } else {
            (self.depth / w, self.extent)
        };
        let run = self.run(along);
        let (c, o) = if run == along {
            (scaled(&format!("v % {along}u"), w), format!("v / {along}u"))
        } else {
            (
                scaled(&format!("(v / {}u) * {run}u + v % {run}u", run * across), w),
                format!("(v / {run}u) % {across}u"),
            )
        };
        let (p, kk) = if self.along_places { (c, o) } else { (o, c) };
        format!(
            "let v = lid + {off}u; let p = {p}; let kk = {kk};",
            off = q * self.invocations,
        )
    }

    /// Consecutive vectors an invocation's neighbours take along the
    /// contiguous dimension (of `along` vectors), see [`Self::locate`].
    fn run(&self, along: usize) -> usize {
        if self.width == 1 || self.shared_step() == 1 || !along.is_multiple_of(TRANSPOSING_RUN) {
            along
        } else {
            TRANSPOSING_RUN
        }
    }

    /// The WGSL `let` after [`Self::locate`]'s: `sh`, the index of the
    /// load's first element in the workgroup array.
    pub fn shared(&self) -> String {
        format!(
            "let sh = {}p * {}u + kk * {}u;",
            self.shared_base, self.shared_place, self.shared_depth
        )
    }

    /// WGSL `let`s after [`Self::locate`]'s, for the slice at depth `kf`:
    /// `gp`, `gk` (the load's place and depth in the operand), `inb`
    /// (inside the product: with vectors the whole vector, see
    /// [`aligned`]) and `gi` (its first element's index in the buffer).
    pub fn global(&self) -> String {
        // Along the unit stride (vector loads) no multiply.
        let (ps, ks) = match (self.width > 1, self.along_places) {
            (true, true) => (String::new(), format!(" * {}", self.depth_stride)),
            (true, false) => (format!(" * {}", self.place_stride), String::new()),
            (false, _) => (
                format!(" * {}", self.place_stride),
                format!(" * {}", self.depth_stride),
            ),
        };
        format!(
            "let gp = {base} + p; let gk = kf + kk; let inb = gp < {limit} && gk < k; \
             let gi = u32({offset} + i32(gp){ps} + i32(gk){ks});",
            base = self.base,
            limit = self.limit,
            offset = self.offset,
        )
    }

    /// Workgroup elements between consecutive elements of one vector.
    pub fn shared_step(&self) -> usize {
        if self.along_places {
            self.shared_place
        } else {
            self.shared_depth
        }
    }
}

/// Neighbouring invocations' vectors along the contiguous dimension where
/// staging transposes them (each vector's elements a staged row apart in
/// workgroup memory): two 16-byte vectors, one 32-byte sector of global
/// memory, so that a warp's 32 invocations spread over 16 places across
/// the dimension. Their stores then fall in different banks, two
/// invocations at most a bank (a warp along one 128-element place stores
/// every element to one bank in the cooperative kernel: its staged rows
/// are 20 words apart, 8 places 160 words, a multiple of the 32 banks);
/// the f32 kernel's depth rows, 132 words apart, take no conflict at all.
const TRANSPOSING_RUN: usize = 2;

/// `expr * w`, or `expr` for `w` = 1.
fn scaled(expr: &str, w: usize) -> String {
    if w == 1 {
        format!("({expr})")
    } else {
        format!("({expr}) * {w}u")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense `rows x cols` operand from element `offset` (by columns
    /// when `by_cols`: stored transposed), unbatched.
    fn dense(offset: usize, rows: usize, cols: usize, by_cols: bool) -> OperandLayout<'static> {
        let (row_stride, col_stride) = if by_cols {
            (1, rows as isize)
        } else {
            (cols as isize, 1)
        };
        OperandLayout {
            offset,
            row_stride,
            col_stride,
            rows,
            cols,
            by_cols,
            batch_strides: &[],
        }
    }

    #[test]
    fn dense_operands_are_aligned_when_offset_and_contiguous_extent_are() {
        assert!(aligned(4, &dense(0, 3, 8, false), &[]));
        assert!(aligned(4, &dense(8, 3, 8, false), &[]));
        assert!(aligned(4, &dense(0, 8, 3, true), &[]));
        // The contiguous extent, not the other one, must be a multiple.
        assert!(!aligned(4, &dense(0, 8, 3, false), &[]));
        assert!(!aligned(4, &dense(0, 3, 8, true), &[]));
        assert!(!aligned(4, &dense(1, 3, 8, false), &[]));
        assert!(!aligned(8, &dense(4, 3, 8, false), &[]));
        assert!(!aligned(8, &dense(0, 3, 12, false), &[]));
        // Empty: a depth of 0.
        assert!(!aligned(4, &dense(0, 8, 0, false), &[]));
        assert!(!aligned(4, &dense(0, 0, 8, true), &[]));
    }

    #[test]
    fn strides_must_be_multiples_of_the_width_along_a_unit_stride() {
        // A leading dimension off the width (a slice of wider rows).
        let mut x = dense(0, 4, 8, false);
        x.row_stride = 10;
        assert!(!aligned(4, &x, &[]));
        x.row_stride = 12;
        assert!(aligned(4, &x, &[]));
        // Rows broadcast (stride 0) and reversed strides are multiples.
        x.row_stride = 0;
        assert!(aligned(4, &x, &[]));
        x.row_stride = -12;
        assert!(aligned(4, &x, &[]));
        // No unit stride along the contiguous dimension: every other column.
        x.row_stride = 16;
        x.col_stride = 2;
        assert!(!aligned(4, &x, &[]));
    }

    #[test]
    fn batch_strides_count_only_for_batches_longer_than_one() {
        let strides = [6, 32];
        let x = OperandLayout {
            batch_strides: &strides,
            ..dense(0, 4, 8, false)
        };
        assert!(!aligned(4, &x, &[2, 3]));
        assert!(aligned(4, &x, &[1, 3]));
        assert!(aligned(2, &x, &[2, 3]));
        // Broadcast batches (stride 0).
        let zero = [0, 32];
        let y = OperandLayout {
            batch_strides: &zero,
            ..dense(0, 4, 8, false)
        };
        assert!(aligned(8, &y, &[5, 3]));
    }
}
