
    let rows = b() * h() * lq();
    if (i >= rows) { return; }
    let qi = i % lq();
    let bh = i / lq();
    let q0 = row_of(0u, params[6], bh, qi);
    var m = neg_inf();
    var total = 0.0;
    var acc: array<f32, DV>;
    for (var c = 0u; c < DV; c = c + 1u) { acc[c] = 0.0; }
    for (var j = 0u; j < limit(qi); j = j + 1u) {
        let k0 = row_of(1u, params[7], bh, j);
        var s = 0.0;
        for (var c = 0u; c < D; c = c + 1u) { s = s + load_q(q0 + c) * load_k(k0 + c); }
        s = s * scale();
        let mn = max(m, s);
        let keep = exp(m - mn);
        let p = exp(s - mn);
        total = total * keep + p;
        let v0 = row_of(2u, params[8], bh, j);
        for (var c = 0u; c < DV; c = c + 1u) { acc[c] = acc[c] * keep + p * load_v(v0 + c); }
        m = mn;
    }
    let hi = bh % h();
    let bi = bh / h();
    let o0 = ((bi * lq() + qi) * h() + hi) * DV;
    for (var c = 0u; c < DV; c = c + 1u) { store_o(o0 + c, acc[c] / total); }
    store_out(rows * DV + i, m + log(total));
}
