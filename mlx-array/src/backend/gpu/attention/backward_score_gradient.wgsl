//! A template, filled by `source` (attention/backward.rs) through `codegen::fill`;
//! its placeholders: `{r}`, `{c}`, `{i}`, `{j}`, `{keep}`, `{at}`.
        {
            var p = 0.0;
            if (q0 + ty + {r}u < lq() && k0 + tx + {c}u < limit(q0 + ty + {r}u)) {
                p = exp(s{i}_{j} * scale() - lse_s[ty + {r}u]);
            }{keep}
            ds_s[{at}] = p * (dp{i}_{j} - dl_s[ty + {r}u]);
        }