//! A template, filled by `attention_grad` (attention/rows.rs) through `codegen::fill`;
//! its placeholders: `{DELTA}`, `{PROBABILITY}`.
    if (i >= b() * hkv() * lk()) { return; }
    let j = i % lk();
    // Key/value head `kh` of batch `bi`, and its group's first query head.
    let kh = i / lk() % hkv();
    let bi = i / lk() / hkv();
    let bh0 = bi * h() + kh * group();
    var dk: array<f32, D>;
    var dv: array<f32, DV>;
    for (var c = 0u; c < D; c = c + 1u) { dk[c] = 0.0; }
    for (var c = 0u; c < DV; c = c + 1u) { dv[c] = 0.0; }
    // The first query that sees key j.
    var first = 0u;
    if (params[4] != 0u && j + lq() > lk()) { first = j + lq() - lk(); }
    for (var bh = bh0; bh < bh0 + group(); bh = bh + 1u) {
    let lse0h = lse0 + bh * lq();
    for (var qi = first; qi < lq(); qi = qi + 1u) {
        let q0 = row_of(0u, params[6], bh, qi);
        let g0 = row_of(3u, params[10], bh, qi);
        {DELTA}
        {PROBABILITY}
        for (var c = 0u; c < D; c = c + 1u) { dk[c] = dk[c] + ds * load_q(q0 + c); }
        for (var c = 0u; c < DV; c = c + 1u) { dv[c] = dv[c] + p * load_g(g0 + c); }
    }
    }
    let row = (bi * lk() + j) * hkv() + kh;
    for (var c = 0u; c < D; c = c + 1u) { store_out(params[11] + row * D + c, dk[c] * scale()); }
    for (var c = 0u; c < DV; c = c + 1u) { store_out(params[12] + row * DV + c, dv[c]); }
}
