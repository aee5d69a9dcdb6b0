
        let k0 = row_of(1u, params[7], bh, j);
        let v0 = row_of(2u, params[8], bh, j);
        var s = 0.0;
        for (var c = 0u; c < D; c = c + 1u) { s = s + load_q(q0 + c) * load_k(k0 + c); }
        let p = exp(s * scale() - load_packed(lse0h + qi));
        var dp = 0.0;
        for (var c = 0u; c < DV; c = c + 1u) { dp = dp + load_g(g0 + c) * load_v(v0 + c); }
        let ds = p * (dp - delta);
