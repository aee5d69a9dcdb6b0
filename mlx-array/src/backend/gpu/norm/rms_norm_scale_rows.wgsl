    if (!live) { return; }
    let r = 1.0 / sqrt(part[lid - t] / f32(width) + bitcast<f32>(params[2]));
    for (var j = t; j < width; j = j + T) {
        store_out(row * width + j, load_x(x0 + j) * r * load_w(params[4] + j));
    }
}
