//! A template, filled by `cumsum` (scan/mod.rs) through `codegen::fill`;
//! its placeholders: `{acc}`, `{entry}`, `{index}`, `{zero}`, `{pos}`, `{conv}`, `{conv0}`, `{before}`, `{after}`.

var<workgroup> part: array<{acc}, 256>;
{entry} {
    {index}
    let live = g < params[0];
    let len = params[1];
    let nk = params[2];
    let sa = bitcast<i32>(params[4]);
    let so = i32(params[5]);
    var ib = bitcast<i32>(params[3]);
    var ob = 0;
    var rem = g;
    for (var d = i32(nk) - 1; d >= 0; d = d - 1) {
        let s = params[6u + u32(d)];
        let c = i32(rem % s);
        ib = ib + c * bitcast<i32>(params[6u + nk + u32(d)]);
        ob = ob + c * i32(params[6u + 2u * nk + u32(d)]);
        rem = rem / s;
    }
    let chunk = (len + 255u) / 256u;
    let lo = min(lid * chunk, len);
    let hi = min(lo + chunk, len);
    var sum: {acc} = {zero};
    if (live) {
        for (var k = lo; k < hi; k = k + 1u) {
            let j = {pos};
            let x = load_in0(u32(ib + i32(j) * sa));
            sum = sum + {conv};
        }
    }
    part[lid] = sum;
    workgroupBarrier();
    for (var off = 1u; off < 256u; off = off << 1u) {
        var v = part[lid];
        if (lid >= off) { v = v + part[lid - off]; }
        workgroupBarrier();
        part[lid] = v;
        workgroupBarrier();
    }
    var acc: {acc} = {zero};
    if (lid > 0u) { acc = part[lid - 1u]; }
    if (live) {
        for (var k = lo; k < hi; k = k + 1u) {
            let j = {pos};
            let x0 = load_in0(u32(ib + i32(j) * sa));
            let x = {conv0};
            {before}
            {after}
        }
    }
}
