    var ss = 0.0;
    if (live) {
        for (var j = t; j < width; j = j + T) { let v = load_x(x0 + j); ss = ss + v * v; }
    }
    part[lid] = ss;
