
    if (i >= params[0]) { return; }
    let width = params[1];
    let half = width / 2u;
    let per_row = half / 4u;
    let row = i / per_row;
    let c = (i - row * per_row) * 4u;
    let e = row * width + c;
    let at = loc(e, 9u + params[7]);
    let a = load4_x(at >> 2u);
    let b = load4_x((at + half) >> 2u);
    let pos = f32(params[3] + row % params[2]) * bitcast<f32>(params[4]);
    let pair = vec4<f32>(f32(c), f32(c + 1u), f32(c + 2u), f32(c + 3u));
    let theta = pos * exp(pair * bitcast<f32>(params[5]));
    var s = sin(theta);
    if (params[6] != 0u) { s = -s; }
    let co = cos(theta);
    let o = out_at(e, at);
    store4(o >> 2u, a * co - b * s);
    store4((o + half) >> 2u, a * s + b * co);
}
