//! A template, filled by `locators` (reduce/mod.rs) through `codegen::fill`:
//! `base(o)`, where output `o`'s run starts, and `at(r)`, the offset of
//! its `r`-th value from there, whose body is `{at}`.

fn base(o: u32) -> i32 {
    let nk = params[2];
    var idx = bitcast<i32>(params[4]);
    var rem = o;
    for (var d = i32(nk) - 1; d >= 0; d = d - 1) {
        let s = params[5u + u32(d)];
        idx = idx + i32(rem % s) * bitcast<i32>(params[5u + nk + u32(d)]);
        rem = rem / s;
    }
    return idx;
}
fn at(r: u32) -> i32 {
{at}
}
