//! A template, filled by `source` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{inv}`.
    for (var i = lid; i < BQ; i = i + {inv}u) {
        var lse = 0.0;
        var dl = 0.0;
        if (q0 + i < lq()) {
            lse = packed[params[9] + b() * h() * lq() * DV + bh * lq() + q0 + i];
            dl = delta[params[11] + bh * lq() + q0 + i];
        }
        lse_s[i] = lse;
        dl_s[i] = dl;
    }
