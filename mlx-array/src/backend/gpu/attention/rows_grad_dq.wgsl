//! A template, filled by `attention_grad` (attention/rows.rs) through `codegen::fill`;
//! its placeholders: `{DELTA}`, `{PROBABILITY}`.
    if (i >= b() * h() * lq()) { return; }
    let qi = i % lq();
    let bh = i / lq();
    let q0 = row_of(0u, params[6], bh, qi);
    let g0 = row_of(3u, params[10], bh, qi);
    let lse0h = lse0 + bh * lq();
    {
        {DELTA}
        var acc: array<f32, D>;
        for (var c = 0u; c < D; c = c + 1u) { acc[c] = 0.0; }
        for (var j = 0u; j < limit(qi); j = j + 1u) {
            {PROBABILITY}
            for (var c = 0u; c < D; c = c + 1u) { acc[c] = acc[c] + ds * load_k(k0 + c); }
        }
        let dq0 = ((bh / h() * lq() + qi) * h() + bh % h()) * D;
        for (var c = 0u; c < D; c = c + 1u) { store_out(dq0 + c, acc[c] * scale()); }
    }
}
