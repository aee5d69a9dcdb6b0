    if (!live) { return; }
    let sums = part[lid - t];
    let r = 1.0 / sqrt(sums.x / f32(width) + bitcast<f32>(params[2]));
    let k = sums.y / f32(width) * r * r * r;
    for (var j = t; j < width; j = j + T) {
        let d = OPEN(r * load_w(params[4] + j) * load_c(c0 + j) - load_x(x0 + j) * k)PLUS;
        store_dx(row * width + j, d);
    }
    if (t == 0u) { store_out(params[6] + width + row, r); }
}
