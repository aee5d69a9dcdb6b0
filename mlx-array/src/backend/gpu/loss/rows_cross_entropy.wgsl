    if (lid == 0u) {
        var loss = bitcast<f32>(0x7fc00000u);
        if (t >= 0) { loss = lse - x_at(base + u32(t)); }
        store_out(row, loss);
    }
}
