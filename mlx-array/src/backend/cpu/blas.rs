//! Single-precision GEMM: a system BLAS found at run time (OpenBLAS on Linux,
//! Accelerate on macOS), or the pure-Rust `matrixmultiply` crate.
//!
//! Loading the BLAS at run time keeps the build free of system packages: a
//! machine without OpenBLAS still builds and runs, only slower. Set
//! `MLX_BLAS=none` to force the pure-Rust path, or `MLX_BLAS=/path/lib.so` to
//! choose a library.

use std::sync::OnceLock;

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
    sgemm: Sgemm,
    _lib: libloading::Library,
}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

fn candidates() -> Vec<String> {
    if let Ok(v) = std::env::var("MLX_BLAS") {
        return if v == "none" { vec![] } else { vec![v] };
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
        return Some(Blas {
            name,
            sgemm,
            _lib: lib,
        });
    }
    None
}

fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load).as_ref()
}

/// The GEMM in use: the BLAS library's name, or `matrixmultiply (pure Rust)`.
pub fn name() -> String {
    blas().map_or_else(
        || "matrixmultiply (pure Rust)".to_string(),
        |b| b.name.clone(),
    )
}

/// True when a system BLAS was found.
pub fn has_system_blas() -> bool {
    blas().is_some()
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
