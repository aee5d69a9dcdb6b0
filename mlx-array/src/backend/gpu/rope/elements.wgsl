
    if (i >= params[0]) { return; }
    let width = params[2];
    let dims = params[3];
    let c = i % width;
    let x0 = params[9] + i - c;
    if (c >= dims) { store_out(i, load_x(x0 + c)); return; }
    let half = dims / 2u;
    var pair = c % half;
    var first = c < half;
    var partner = c + half;
    if (!first) { partner = c - half; }
    if (params[4] != 0u) {
        pair = c / 2u;
        first = c % 2u == 0u;
        partner = c + 1u;
        if (!first) { partner = c - 1u; }
    }
    let pos = f32(params[5] + (i / width) % params[1]) * bitcast<f32>(params[6]);
    let theta = pos * exp(f32(pair) * bitcast<f32>(params[7]));
    var s = sin(theta);
    if (params[8] != 0u) { s = -s; }
    let co = cos(theta);
    let own = load_x(x0 + c);
    let other = load_x(x0 + partner);
    if (first) { store_out(i, own * co - other * s); } else { store_out(i, other * s + own * co); }
}
