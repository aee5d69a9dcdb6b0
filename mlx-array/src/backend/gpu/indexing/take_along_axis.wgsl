//! A template, filled by `take_along_axis` (indexing/mod.rs) through `codegen::fill`;
//! its placeholders: `{zero}`.
    let axis = params[1]; let ab = params[2]; let ib = params[3];
    let nd = params[ib];
    var rem = i;
    var off = bitcast<i32>(params[ab + 1u + nd]);
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = vshape(ib, u32(d));
        let c = rem % s;
        rem = rem / s;
        if (u32(d) != axis) { off = off + i32(c) * vstride(ab, u32(d)); }
    }
    let j = resolve(idx_at(vloc(i, ib)), vshape(ab, axis));
    var v = {zero};
    if (j >= 0) { v = load_a(u32(off + j * vstride(ab, axis))); }
    store_out(i, v);
}
