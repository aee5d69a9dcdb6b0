
    if (i >= b() * h() * lq()) { return; }
    let qi = i % lq();
    let bh = i / lq();
    let o0 = params[6] + ((bh / h() * lq() + qi) * h() + bh % h()) * DV;
    let g0 = row_of(3u, params[7], bh, qi);
    var delta = 0.0;
    for (var c = 0u; c < DV; c = c + 1u) { delta = delta + load_g(g0 + c) * load_packed(o0 + c); }
    store_out(i, delta);
}
