//! Single-precision GEMM: a system BLAS found at run time (OpenBLAS on Linux,
//! Accelerate on macOS), or the pure-Rust `matrixmultiply` crate.
//!
//! Loading the BLAS at run time keeps the build free of system packages: a
//! machine without OpenBLAS still builds and runs, only slower. Set
//! `MLX_BLAS=none` to force the pure-Rust path, or `MLX_BLAS=/path/lib.so` to
//! choose a library.

use std::sync::OnceLock;

use crate::settings::{self, BlasChoice};
use crate::{Error, Result};

type Sgemm = unsafe extern "C" fn(
    layout: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

struct Blas {
    name: String,
    /// OpenBLAS's `openblas_get_corename`, when the library has it.
    core: Option<String>,
    sgemm: Sgemm,
    _lib: libloading::Library,
}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

fn candidates() -> Vec<String> {
    match settings::blas() {
        BlasChoice::None => return vec![],
        BlasChoice::Library(v) => return vec![v],
        BlasChoice::System => {}
    }
    if cfg!(target_os = "macos") {
        vec!["/System/Library/Frameworks/Accelerate.framework/Accelerate".into()]
    } else {
        [
            "libopenblas.so.0",
            "libopenblas.so",
            "libopenblasp.so.0",
            "libblis.so.4",
            "libmkl_rt.so",
        ]
        .map(String::from)
        .to_vec()
    }
}

fn load() -> Option<Blas> {
    for name in candidates() {
        // SAFETY: loading a BLAS runs its initialisers, which are well behaved.
        let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        // SAFETY: cblas_sgemm has this C signature in every CBLAS.
        let Ok(sym) = (unsafe { lib.get::<Sgemm>(b"cblas_sgemm\0") }) else {
            continue;
        };
        let sgemm = *sym;
        type CoreName = unsafe extern "C" fn() -> *const std::ffi::c_char;
        // SAFETY: openblas_get_corename takes nothing and returns a static C string.
        let core = unsafe { lib.get::<CoreName>(b"openblas_get_corename\0") }
            .ok()
            .map(|f| {
                // SAFETY: as above; the pointer is checked for null.
                let p = unsafe { f() };
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: a NUL-terminated static string.
                    unsafe { std::ffi::CStr::from_ptr(p) }
                        .to_string_lossy()
                        .into_owned()
                }
            });
        if let (Some(c), Some(want)) = (&core, openblas_coretype_for_cpu())
            && c.eq_ignore_ascii_case("prescott")
        {
            tracing::warn!(
                "{name} chose its generic `{c}` kernels on a CPU that runs `{want}` ones (several times faster): set OPENBLAS_CORETYPE={want}"
            );
        }
        return Some(Blas {
            name,
            core,
            sgemm,
            _lib: lib,
        });
    }
    None
}

fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load).as_ref()
}

/// The GEMM in use: the BLAS library's name (with OpenBLAS's kernel family),
/// or `matrixmultiply (pure Rust)`.
pub fn name() -> String {
    blas().map_or_else(
        || "matrixmultiply (pure Rust)".to_string(),
        |b| match &b.core {
            Some(c) => format!("{} ({c} kernels)", b.name),
            None => b.name.clone(),
        },
    )
}

/// The OpenBLAS kernel family (`OPENBLAS_CORETYPE`) this CPU can run:
/// `SkylakeX` with AVX-512, `Haswell` with AVX2 and FMA, else `None`.
///
/// OpenBLAS picks its kernels from the CPU model, and releases older than
/// the CPU (0.3.21 on an Emerald Rapids Xeon, for one) may fall back to the
/// generic `Prescott` kernels, which run SGEMM about five times slower.
/// Naming the family in the environment before the library loads avoids that.
pub fn openblas_coretype_for_cpu() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
        {
            return Some("SkylakeX");
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some("Haswell");
        }
    }
    None
}

/// Sets `OPENBLAS_CORETYPE` to [`openblas_coretype_for_cpu`] unless the
/// environment already names one, so that the BLAS loaded later uses this
/// CPU's kernels. Returns the value now in effect.
///
/// # Safety
/// Changes the process environment: call it at the start of `main`, before
/// any other thread exists (see [`std::env::set_var`]).
pub unsafe fn prefer_native_openblas_kernels() -> Option<String> {
    if let Ok(v) = std::env::var("OPENBLAS_CORETYPE") {
        return Some(v);
    }
    let want = openblas_coretype_for_cpu()?;
    // SAFETY: the caller guarantees that no other thread runs.
    unsafe { std::env::set_var("OPENBLAS_CORETYPE", want) };
    Some(want.to_string())
}

/// True when a system BLAS was found.
pub fn has_system_blas() -> bool {
    blas().is_some()
}

/// Fails when `MLX_BLAS` names a library that cannot be loaded (or has no
/// `cblas_sgemm`), naming the variable.
pub(crate) fn check_choice() -> Result<()> {
    if let BlasChoice::Library(name) = settings::blas()
        && !has_system_blas()
    {
        return Err(Error::invalid(
            settings::MLX_BLAS,
            format!(
                "cannot load `{name}` (or it has no cblas_sgemm); use a CBLAS library's path, or none"
            ),
        ));
    }
    Ok(())
}

/// `C = alpha * op(A) @ op(B) + beta * C` for row-major matrices, where `A`
/// is `m x k` (stored `k x m` when `trans_a`), `B` is `k x n` (or `n x k`),
/// and `lda`, `ldb`, `ldc` are row strides in elements.
///
/// # Safety
/// The pointers must address matrices of the stated sizes and strides, and
/// `c` must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    match blas() {
        Some(blas) if k > 0 => unsafe {
            (blas.sgemm)(
                ROW_MAJOR,
                if trans_a { TRANS } else { NO_TRANS },
                if trans_b { TRANS } else { NO_TRANS },
                m as i32,
                n as i32,
                k as i32,
                alpha,
                a,
                lda as i32,
                b,
                ldb as i32,
                beta,
                c,
                ldc as i32,
            )
        },
        _ => {
            let (rsa, csa) = if trans_a {
                (1, lda as isize)
            } else {
                (lda as isize, 1)
            };
            let (rsb, csb) = if trans_b {
                (1, ldb as isize)
            } else {
                (ldb as isize, 1)
            };
            // SAFETY: forwarded from the caller.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    alpha,
                    a,
                    rsa,
                    csa,
                    b,
                    rsb,
                    csb,
                    beta,
                    c,
                    ldc as isize,
                    1,
                )
            }
        }
    }
}

/// A row-major f32 matrix for [`gemm`]: its first element and its row
/// stride (a raw view: [`gemm`]'s caller vouches for the memory).
#[derive(Clone, Copy)]
pub(crate) struct Mat(pub *mut f32, pub usize);

impl Mat {
    /// A dense block of `cols` columns.
    pub(crate) fn dense(block: &mut [f32], cols: usize) -> Mat {
        Mat(block.as_mut_ptr(), cols)
    }

    /// A matrix that is only read, at `ptr` with row stride `ld`.
    pub(crate) fn input(ptr: *const f32, ld: usize) -> Mat {
        Mat(ptr.cast_mut(), ld)
    }
}

/// `c = alpha * op(a) @ op(b) + beta * c` with `op(a)` `m x k` and `op(b)`
/// `k x n`: the one GEMM entry of the CPU kernels ([`sgemm`] over [`Mat`]s;
/// `k == 0` makes `c` `beta * c`).
///
/// # Safety
/// As [`sgemm`]: the matrices lie inside live buffers and `c` overlaps
/// neither `a` nor `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    ta: bool,
    tb: bool,
    [m, n, k]: [usize; 3],
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: Mat,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        sgemm(
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            a.0,
            a.1.max(1),
            b.0,
            b.1.max(1),
            beta,
            c.0,
            c.1.max(1),
        )
    }
}
