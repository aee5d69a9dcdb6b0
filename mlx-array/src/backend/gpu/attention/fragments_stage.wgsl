//! A template, filled by `stage` (attention/fragments.rs) through `codegen::fill`;
//! its placeholders: `{rows}`, `{padded}`, `{inv}`, `{valid}`, `{width}`, `{read}`, `{tile}`, `{stride}`.
    for (var e = lid; e < {rows}u * {padded}u; e = e + {inv}u) {
        let r = e / {padded}u;
        let c = e % {padded}u;
        var x = 0.0h;
        if (r < {valid} && c < {width}u) { x = {read}; }
        {tile}[r * {stride}u + c] = x;
    }
