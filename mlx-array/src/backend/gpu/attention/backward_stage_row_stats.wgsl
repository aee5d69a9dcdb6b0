
    if (lid < BQ) {
        var lse = 0.0;
        var dl = 0.0;
        if (q0 + lid < lq()) {
            lse = load_packed(params[9] + b() * h() * lq() * DV + bh * lq() + q0 + lid);
            dl = load_delta(params[11] + bh * lq() + q0 + lid);
        }
        lse_s[lid] = lse;
        dl_s[lid] = dl;
    }
