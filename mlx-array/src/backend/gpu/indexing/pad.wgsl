//! A template, filled by `pad` (indexing/mod.rs) through `codegen::fill`;
//! its placeholders: `{t}`.
    let xb = params[1]; let os = params[2]; let lw = params[3];
    let nd = params[xb];
    var rem = i; var inside = true; var xi = 0u; var mul = 1u;
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = params[os + u32(d)];
        let c = rem % s;
        rem = rem / s;
        let xs = vshape(xb, u32(d));
        let lo = params[lw + u32(d)];
        if (c < lo || c - lo >= xs) { inside = false; } else { xi = xi + (c - lo) * mul; }
        mul = mul * xs;
    }
    var v = bitcast<{t}>(params[4]);
    if (inside) { v = load_x(vloc(xi, xb)); }
    store_out(i, v);
}
