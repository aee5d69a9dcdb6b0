//! Every variant of the fragment attention kernels, for the test that
//! compiles them all through naga to SPIR-V.

use super::fragment::Fragments;
use super::{Loads, Tiles, WORKGROUP_BYTES, backward, fragments, fragments_backward};
use crate::Dtype;
use crate::backend::common::attention::AttentionDims;

/// The f16 fragment forward's WGSL, named with its workgroup memory, for
/// both fragment implementations at the head widths of the specs and the
/// model (`d = dv = 64`, `32`, `128`, and `40 x 24`, padded), each at
/// every candidate tile that fits 48 KiB. The sources start with
/// `enable f16;`. For the test that compiles them through naga to SPIR-V.
#[doc(hidden)]
pub fn kernel_sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (d, dv) in [(64, 64), (32, 32), (128, 128), (40, 24)] {
        let dims = AttentionDims {
            b: 1,
            h: 1,
            hkv: 1,
            lq: 1,
            lk: 1,
            d,
            dv,
            scale: 1.0,
            causal: false,
        };
        for (bq, bk) in fragments::CANDIDATES {
            let t = Tiles { bq, bk };
            let bytes = fragments::bytes(&dims, t);
            if bytes > WORKGROUP_BYTES {
                continue;
            }
            for f in [Fragments::Cooperative, Fragments::Plain] {
                for loads in [Loads::Scalar, Loads::Quads] {
                    out.push((
                        format!(
                            "attention fragments d {d} dv {dv} {t:?} {f:?} {loads:?} ({bytes} B)"
                        ),
                        format!(
                            "enable f16;\n{}",
                            fragments::source(&dims, t, f, loads, Some(Dtype::F16))
                        ),
                    ));
                }
            }
        }
        for pass in [backward::Pass::KeyValue, backward::Pass::Query] {
            for &(bq, bk) in fragments_backward::candidates(pass) {
                let t = Tiles { bq, bk };
                let bytes = fragments_backward::bytes(&dims, t, pass);
                if bytes > WORKGROUP_BYTES {
                    continue;
                }
                for f in [Fragments::Cooperative, Fragments::Plain] {
                    for loads in [Loads::Scalar, Loads::Quads] {
                        for g16 in [false, true] {
                            out.push((
                                format!("attention_grad fragments {pass:?} d {d} dv {dv} {t:?} {f:?} {loads:?} f16 cotangent {g16} ({bytes} B)"),
                                format!(
                                    "enable f16;\n{}",
                                    fragments_backward::source(&dims, t, pass, f, (loads, g16))
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}
