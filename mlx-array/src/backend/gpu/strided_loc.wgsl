//! A template, filled by `strided_loc` (codegen.rs) through `fill`: `loc(i, base)`,
//! with the view's dimensions at `params[{ndim_at}]` and its shape from
//! `params[{shape_at}]`.

fn loc(i: u32, base: u32) -> u32 {
    let nd = params[{ndim_at}u];
    var idx = bitcast<i32>(params[base]);
    var rem = i;
    for (var d = i32(nd) - 1; d >= 0; d = d - 1) {
        let s = params[{shape_at}u + u32(d)];
        idx = idx + i32(rem % s) * bitcast<i32>(params[base + 1u + u32(d)]);
        rem = rem / s;
    }
    return u32(idx);
}
