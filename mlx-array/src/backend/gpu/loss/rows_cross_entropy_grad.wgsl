    let c = f32(load_c(vloc(row, params[4])));
    let bad = t < 0;
    // Every thread has read its elements above; no one else writes them.
    for (var j = lid; j < vocab; j = j + 256u) {
        let e = rnd(exp(x_at(base + j) - lse) * c);
        var g = e;
        if (bad) { g = bitcast<f32>(0x7fc00000u); } else if (i32(j) == t) { g = e - c; }
        store_out(row * vocab + j, g);
    }
}
