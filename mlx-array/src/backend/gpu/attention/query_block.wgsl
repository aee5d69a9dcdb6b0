    let g = wid.x + wid.y * nw.x;
    let blocks = (lq() + BQ - 1u) / BQ;
    if (g >= b() * h() * blocks) { return; }
    let bh = g / blocks;
    let q0 = (g % blocks) * BQ;
    let hi = bh % h();
    let bi = bh / h();
