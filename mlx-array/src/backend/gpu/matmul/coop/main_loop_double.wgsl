//! A template, filled by `source` (matmul/coop/mod.rs) through
//! `codegen::fill`: the main loop over the depth with two buffers of staged
//! slices (`{a_len}` and `{b_len}` halves each) of `{DEPTH}`: `{fetch}`
//! loads a slice into registers, `{put}` stores them into the buffer at
//! `pa`/`pb`, `{step}` multiplies the buffer at `abuf`/`bbuf`.
    var k0 = 0u;
    var cur = 0u;
    {
        let kf = 0u;
        let pa = 0u;
        let pb = 0u;
{fetch}{put}    }
    workgroupBarrier();
    loop {
        if (k0 >= k) { break; }
        let kf = k0 + {DEPTH}u;
        let next = kf < k;
        if (next) {
{fetch}        }
        let abuf = cur * {a_len}u;
        let bbuf = cur * {b_len}u;
{step}        let nbuf = 1u - cur;
        if (next) {
            let pa = nbuf * {a_len}u;
            let pb = nbuf * {b_len}u;
{put}        }
        workgroupBarrier();
        cur = nbuf;
        k0 = kf;
    }
