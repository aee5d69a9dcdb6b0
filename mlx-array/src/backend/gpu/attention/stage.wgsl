//! A template, filled by `stage` (attention/text.rs) through
//! `codegen::fill`: the 256 invocations stage `{rows}` rows of `{padded}`
//! elements (`{valid}` rows and `{width}` columns read with
//! `load_{name}` from `{base}`, rows `{step}` apart; zeros past them) into
//! the workgroup array `{tile}`, rows `{stride}` quads apart.

    for (var e = lid; e < {rows}u * {padded}u; e = e + 256u) {
        let r = e / {padded}u;
        let c = e % {padded}u;
        var x = 0.0;
        if (r < {valid} && c < {width}u) { x = load_{name}({base} + r * {step} + c); }
        {tile}[r * {stride}u + c / 4u][c % 4u] = x;
    }
