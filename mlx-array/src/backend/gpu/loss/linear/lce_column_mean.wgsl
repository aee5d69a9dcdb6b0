//! A template, filled by `column_mean` (loss/linear.rs) through
//! `codegen::fill`: the body of the entry point (after `codegen::ENTRY`),
//! with `{index}` the thread index.
 {
    {index}
    let dims = params[0];
    if (i >= dims) { return; }
    var acc = 0.0;
    for (var v = 0u; v < params[1]; v = v + 1u) { acc = acc + load_w(params[2] + v * dims + i); }
    out[i] = acc / f32(params[1]);
}
