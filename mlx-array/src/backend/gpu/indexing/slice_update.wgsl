    let bb = params[1]; let ub = params[2]; let sa = params[3]; let sp = params[4];
    let nd = params[bb];
    var rem = i; var inside = true; var ui = 0u; var mul = 1u;
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = vshape(bb, u32(d));
        let c = rem % s;
        rem = rem / s;
        let us = vshape(ub, u32(d));
        let diff = i32(c) - i32(params[sa + u32(d)]);
        let st = bitcast<i32>(params[sp + u32(d)]);
        if (diff % st != 0) {
            inside = false;
        } else {
            let t = diff / st;
            if (t < 0 || t >= i32(us)) { inside = false; } else { ui = ui + u32(t) * mul; }
        }
        mul = mul * us;
    }
    if (inside) { store_out(i, load_u(vloc(ui, ub))); } else { store_out(i, load_b(vloc(i, bb))); }
}
