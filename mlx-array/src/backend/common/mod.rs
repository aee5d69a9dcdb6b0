//! What both backends read and neither owns: the descriptions of kernels
//! (the op enums, the sizes and options of the fused kernels) and the dtype
//! dispatch. Primitives build these descriptions; `cpu` and `gpu` run them.
//! Nothing here computes on arrays, and nothing here imports a backend or
//! the primitives, so the layers point one way: primitives → backends →
//! common → the leaf (`crate::data`, `Dtype`, shapes, memory accounting).

pub mod attention;
pub mod elementwise;
pub mod fusion;
pub mod loss;
pub mod reduce;
pub mod rope;

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::Dtype::Bool => {
                type $T = $crate::Bool8;
                $body
            }
            $crate::Dtype::U32 => {
                type $T = u32;
                $body
            }
            $crate::Dtype::I32 => {
                type $T = i32;
                $body
            }
            $crate::Dtype::I64 => {
                type $T = i64;
                $body
            }
            $crate::Dtype::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::Dtype::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::Dtype::F32 => {
                type $T = f32;
                $body
            }
        }
    };
}
pub(crate) use dispatch;
