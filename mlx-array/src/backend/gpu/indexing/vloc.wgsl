
fn vloc(i: u32, base: u32) -> u32 {
    let nd = params[base];
    var idx = bitcast<i32>(params[base + 1u + nd]);
    var rem = i;
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = params[base + 1u + u32(d)];
        idx = idx + i32(rem % s) * bitcast<i32>(params[base + 2u + nd + u32(d)]);
        rem = rem / s;
    }
    return u32(idx);
}
fn vshape(base: u32, d: u32) -> u32 { return params[base + 1u + d]; }
fn vstride(base: u32, d: u32) -> i32 { return bitcast<i32>(params[base + 2u + params[base] + d]); }
fn resolve(v: i32, len: u32) -> i32 {
    let w = select(v, v + i32(len), v < 0);
    return select(-1, w, w >= 0 && u32(w) < len);
}
