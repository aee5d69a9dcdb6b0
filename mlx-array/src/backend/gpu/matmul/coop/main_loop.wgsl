//! A template, filled by `source` (matmul/coop/mod.rs) through
//! `codegen::fill`: the main loop over the depth with one buffer of staged
//! slices of `{DEPTH}`: `{fetch}` loads a slice into registers, `{put}`
//! stores them into workgroup memory, `{step}` multiplies them.
    var k0 = 0u;
    {
        let kf = 0u;
{fetch}    }
    loop {
        if (k0 >= k) { break; }
{put}        workgroupBarrier();
        let kf = k0 + {DEPTH}u;
        if (kf < k) {
{fetch}        }
{step}        workgroupBarrier();
        k0 = kf;
    }
