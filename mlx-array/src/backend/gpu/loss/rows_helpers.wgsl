
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
fn resolve_target(v: i32, vocab: u32) -> i32 {
    return select(-1, v, v >= 0 && u32(v) < vocab);
}
