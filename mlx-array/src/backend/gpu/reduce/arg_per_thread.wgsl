//! A template, filled by `arg_reduce` (reduce/arg.rs) through
//! `codegen::fill`: the body of the entry point (after `codegen::ENTRY`),
//! one invocation per output, with `{index}` the thread index.
 {
    {index}
    if (i >= params[0]) { return; }
    let b = base(i);
    var bv = load_in0(u32(b));
    var bi = 0u;
    for (var r = 1u; r < params[1]; r = r + 1u) {
        let v = load_in0(u32(b + at(r)));
        if (take(bv, bi, v, r)) { bv = v; bi = r; }
    }
    store_out(i, bi);
}
