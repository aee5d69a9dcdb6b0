//! A template, filled by `row_block_terms` (loss/linear.rs) through
//! `codegen::fill`: the body of the entry point (after `codegen::ENTRY`),
//! with `{index}` the thread index, `{mean}` the smoothing term's loop
//! (or nothing) and `{bad}` the resolved target of a target out of range.
 {
    {index}
    if (i >= params[0]) { return; }
    let dims = params[1];
    let vocab = params[2];
    let sm = bitcast<f32>(params[3]);
    let t = tg[params[8] + i];
    let c = ct[params[6] + i];
    var lse = 0.0;
    var cr = 0.0;
    if (t < vocab && c != 0.0) {
        let hb = params[4] + i * dims;
        let wb = params[5] + t * dims;
        var xt = 0.0;
        for (var d = 0u; d < dims; d = d + 1u) { xt = xt + load_h(hb + d) * load_w(wb + d); }
        var mean = 0.0;
        {mean}
        lse = loss[params[7] + i] + (1.0 - sm) * xt + sm * mean;
        cr = c;
    } else if (t == {bad}u) {
        lse = bitcast<f32>(0x7fc00000u);
        cr = lse;
    }
    out[i * 2u] = lse;
    out[i * 2u + 1u] = cr;
}
