    let nk = params[2];
    let nr = params[3];
    let b = 5u + 2u * nk;
    var idx = 0;
    var rem = r;
    for (var d = i32(nr) - 1; d >= 0; d = d - 1) {
        let s = params[b + u32(d)];
        idx = idx + i32(rem % s) * bitcast<i32>(params[b + nr + u32(d)]);
        rem = rem / s;
    }
    return idx;