//! Whether this CPU has the bfloat16 instructions both bfloat16 GEMMs
//! build on (the AVX512_BF16 kernels of `gemm_bf16`, and `amx`, which
//! rounds its results with them): a leaf below both.

/// Whether this CPU has the instructions: AVX-512F, BW and VL, and
/// AVX512_BF16 (checked once, cheaply, by std).
pub(in crate::backend::cpu) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bf16")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}
