    let ib = params[6]; let ob = params[7];
    let nd = params[ib];
    var rem = i;
    var off = 0;
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = vshape(ib, u32(d));
        let c = rem % s;
        rem = rem / s;
        if (u32(d) != axis) { off = off + i32(c) * vstride(ob, u32(d)); }
    }
    let j = resolve(idx_at(vloc(i, ib)), len);
    if (j >= 0) { atomic_add(u32(off + j * vstride(ob, axis)), v); }
}
