//! A template, filled by `source` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{n}`, `{walk}`, `{ss}`, `{ps}`, `{query}`, `{key}`, `{body}`.
    for (var e = lane; e < {n}u; e = e + 32u) {
        let r = e / {walk}u;
        let c = e % {walk}u;
        let at = (row0 + r) * {ss}u + c;
        let pt = (row0 + r) * {ps}u + c;
        let query = {query};
        let key = {key};
{body}
    }
