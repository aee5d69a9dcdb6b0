//! A template, filled by `write_out` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{ss}`, `{store}`, `{c}`, `{rows}`, `{width}`, `{index}`, `{factor}`.
    {
        let st0 = row0 * {ss}u;
        {store}    }
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {
        let row = own0 + row0 + e / 16u;
        let col = {c}u + e % 16u;
        if (row < {rows} && col < {width}) {
            store_out({index} * {width} + col, st[(row0 + e / 16u) * {ss}u + e % 16u] * {factor});
        }
    }
    workgroupBarrier();
