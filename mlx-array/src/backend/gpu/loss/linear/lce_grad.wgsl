//! A template, filled by `grad_source` (loss/linear.rs) through
//! `codegen::fill`: the body of the entry point (after `codegen::ENTRY`),
//! with `{index}` the thread index.
 {
    {index}
    let n = params[1];
    if (i >= params[0] * n) { return; }
    let r = i / n;
    let j = i % n;
    let lse = terms[r * 2u];
    let c = terms[r * 2u + 1u];
    let sm = bitcast<f32>(params[3]);
    var g = 0.0;
    if (c != 0.0) {
        g = exp(x[i] - lse) * c - c * sm / f32(params[4]);
        if (tg[params[5] + r] == params[2] + j) { g = g - c * (1.0 - sm); }
    }
    store_g(i, g);
}
