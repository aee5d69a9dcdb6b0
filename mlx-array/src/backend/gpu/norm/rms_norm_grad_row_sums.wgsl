    let c0 = params[5] + row * width;
    var acc = vec2<f32>(0.0, 0.0);
    if (live) {
        for (var j = t; j < width; j = j + T) {
            let v = load_x(x0 + j);
            acc = acc + vec2<f32>(v * v, v * load_c(c0 + j) * load_w(params[4] + j));
        }
    }
    part[lid] = acc;
