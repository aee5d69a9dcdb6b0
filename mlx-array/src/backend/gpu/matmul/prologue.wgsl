    let m = params[0];
    let n = params[1];
    let nb = params[3];
    let per = params[4] * params[5];
    let bi = g / per;
    let k = min(params[14], params[2] - (bi / params[15]) * params[14]);
    let tm = (g % per) / params[4];
    let tn = (g % per) % params[4];
    var ao = bitcast<i32>(params[7]);
    var bo = bitcast<i32>(params[10]);
    var rem = bi;
    for (var d = i32(nb) - 1; d >= 0; d = d - 1) {
        let s = params[16u + u32(d)];
        let c = i32(rem % s);
        ao = ao + c * bitcast<i32>(params[16u + nb + u32(d)]);
        bo = bo + c * bitcast<i32>(params[16u + 2u * nb + u32(d)]);
        rem = rem / s;
    }
    let ars = bitcast<i32>(params[8]);
    let acs = bitcast<i32>(params[9]);
    let brs = bitcast<i32>(params[11]);
    let bcs = bitcast<i32>(params[12]);
