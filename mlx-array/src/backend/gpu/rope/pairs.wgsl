
    if (i >= params[0]) { return; }
    let width = params[1];
    let per_row = width / 4u;
    let row = i / per_row;
    let c = (i - row * per_row) * 4u;
    let e = row * width + c;
    let at = loc(e, 9u + params[7]);
    let a = load4_x(at >> 2u);
    let pos = f32(params[3] + row % params[2]) * bitcast<f32>(params[4]);
    let p = f32(c / 2u);
    let pair = vec4<f32>(p, p, p + 1.0, p + 1.0);
    let theta = pos * exp(pair * bitcast<f32>(params[5]));
    var s = sin(theta);
    if (params[6] != 0u) { s = -s; }
    let co = cos(theta);
    let r = vec4<f32>(
        a.x * co.x - a.y * s.x,
        a.x * s.y + a.y * co.y,
        a.z * co.z - a.w * s.z,
        a.z * s.w + a.w * co.w,
    );
    store4(out_at(e, at) >> 2u, r);
}
