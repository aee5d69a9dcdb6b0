//! A template, filled by `rms_norm_grad` (norm/mod.rs) through
//! `codegen::fill`: the end of the `dx` kernel, `{open}` and `{plus}`
//! wrapping each `dx` to add the addend to it (or nothing).
    if (!live) { return; }
    let sums = part[lid - t];
    let r = 1.0 / sqrt(sums.x / f32(width) + bitcast<f32>(params[2]));
    let k = sums.y / f32(width) * r * r * r;
    for (var j = t; j < width; j = j + T) {
        let d = {open}(r * load_w(params[4] + j) * load_c(c0 + j) - load_x(x0 + j) * k){plus};
        store_dx(row * width + j, d);
    }
    if (t == 0u) { store_out(params[6] + width + row, r); }
}
