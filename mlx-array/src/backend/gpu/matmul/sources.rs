//! Every variant of the product kernels, for the test that compiles them
//! all through naga to SPIR-V.

use super::{Epilogue, View, coop, loads, tiled};
use crate::Dtype;
use crate::backend::gpu::codegen;
use crate::settings;

/// Every kernel variant's WGSL, named: both tilings of the cooperative
/// template with both fragment implementations, and the f32 kernel at both
/// tiles and buffer counts, in every transpose case, with scalar and
/// vector staging loads (both operands one way for every dtype, and one
/// of each for the first dtype; the f32 kernel with one buffer, whose
/// staging text is the two-buffer one's, vectors for the first dtype
/// only) (f16 declared as the running device stores it,
/// packed before the GPU is first used). The cooperative sources start
/// with `enable f16;` here. For the test that compiles them all through
/// naga to SPIR-V.
#[doc(hidden)]
pub fn kernel_sources() -> Vec<(String, String)> {
    use loads::VecLoads;
    let mut out = Vec::new();
    let mut views = Vec::new();
    for a_cols in [false, true] {
        for b_cols in [false, true] {
            views.push(View { a_cols, b_cols });
        }
    }
    let uniform = [VecLoads::default(), VecLoads { a: true, b: true }];
    let mixed = [
        VecLoads { a: true, b: false },
        VecLoads { a: false, b: true },
    ];
    // Scalar loads always; vectors for both operands with `vectors`, and
    // for one of them with `first` too.
    let choices = |vectors: bool, first: bool| {
        let mut c = vec![uniform[0]];
        if vectors {
            c.push(uniform[1]);
            if first {
                c.extend(mixed);
            }
        }
        c
    };
    for tiling in coop::Tiling::ALL.into_iter().chain([coop::Tiling::TALL]) {
        // One buffer and one staging fragment at a time, and what 48 KiB
        // allow with one buffer and with two.
        let mut stagings = vec![coop::Staging::LEAST];
        for double in [false, true] {
            let s = coop::Staging::choose(tiling, 48 << 10, double);
            if !stagings.contains(&s) {
                stagings.push(s);
            }
        }
        for staging in stagings {
            for fragments in [coop::Fragments::Cooperative, coop::Fragments::Plain] {
                for &view in &views {
                    for (i, (dtype, epilogue)) in [
                        (Dtype::F16, Epilogue::Store),
                        (Dtype::F32, Epilogue::Store),
                        (Dtype::F32, Epilogue::Accumulate),
                        (Dtype::F16, Epilogue::Addend(Dtype::F16)),
                        (Dtype::F16, Epilogue::Addend(Dtype::F32)),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        for loads in choices(true, i == 0) {
                            out.push((
                                format!(
                                    "coop {tiling:?} {staging:?} {fragments:?} {view:?} {loads:?} {dtype} {epilogue:?} ({} B)",
                                    tiling.shared_bytes_for(staging)
                                ),
                                format!(
                                    "enable f16;\n{}",
                                    coop::source(
                                        tiling, staging, fragments, view, dtype, epilogue, loads
                                    )
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    for tile in [tiled::Tile::T64, tiled::Tile::T128] {
        for buffers in [1, 2] {
            for &view in &views {
                // The last two: split-K partial sums of half operands.
                for (i, (dtype, out_dtype, epilogue)) in [
                    (Dtype::F32, Dtype::F32, Epilogue::Store),
                    (Dtype::F32, Dtype::F32, Epilogue::Accumulate),
                    (Dtype::F32, Dtype::F32, Epilogue::Addend(Dtype::F32)),
                    (Dtype::F16, Dtype::F16, Epilogue::Store),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Store),
                    (Dtype::F16, Dtype::F16, Epilogue::Addend(Dtype::F16)),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Addend(Dtype::BF16)),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Addend(Dtype::F32)),
                    (Dtype::F16, Dtype::F32, Epilogue::Store),
                    (Dtype::BF16, Dtype::F32, Epilogue::Store),
                ]
                .into_iter()
                .enumerate()
                {
                    for loads in choices(buffers == 2 || i == 0, i == 0) {
                        let mut src =
                            tiled::source(tile, buffers, dtype, out_dtype, view, epilogue, loads);
                        if dtype == Dtype::F16 && !codegen::packed(dtype) {
                            src.insert_str(0, "enable f16;\n");
                        }
                        out.push((
                            format!(
                                "f32 kernel {tile:?} x {buffers} {view:?} {loads:?} {dtype} -> {out_dtype} {epilogue:?} ({} B)",
                                tiled::shared_bytes(tile, buffers)
                            ),
                            src,
                        ));
                    }
                }
            }
        }
    }
    // The other large tiles (the tuning's `f32_tile`), f32 only.
    for (choice, _) in &settings::GpuF32Tile::ALL[1..] {
        let tile = tiled::large_tile(*choice);
        // Two buffers only where they fit the H100's 48 KiB.
        for buffers in [1, 2]
            .into_iter()
            .filter(|&b| tiled::shared_bytes(tile, b) <= 48 << 10)
        {
            for &view in &views {
                for epilogue in [
                    Epilogue::Store,
                    Epilogue::Accumulate,
                    Epilogue::Addend(Dtype::F32),
                ] {
                    for loads in choices(true, false) {
                        out.push((
                            format!(
                                "f32 kernel {tile:?} x {buffers} {view:?} {loads:?} {epilogue:?} ({} B)",
                                tiled::shared_bytes(tile, buffers)
                            ),
                            tiled::source(
                                tile,
                                buffers,
                                Dtype::F32,
                                Dtype::F32,
                                view,
                                epilogue,
                                loads,
                            ),
                        ));
                    }
                }
            }
        }
    }
    out
}
