//! A template, filled by `arg_reduce` (reduce/arg.rs) through
//! `codegen::fill`: `take`, whether candidate `(bv, bi)` of type `{t}`
//! replaces `(av, ai)` (`{cmp}`: `>` or `<`; `{nan}`: the NaN checks of
//! f32, or nothing); index `EMPTY` is no candidate.

const EMPTY: u32 = 0xffffffffu;
fn take(av: {t}, ai: u32, bv: {t}, bi: u32) -> bool {
    if (bi == EMPTY) { return false; }
    if (ai == EMPTY) { return true; }
{nan}    if (bv == av) { return bi < ai; }
    return bv {cmp} av;
}
