//! A template, filled by `sum_slices` (matmul/product.rs) through
//! `codegen::fill`: `{output}` declares the output and its `store_out`,
//! `{entry}` is the entry point's signature and `{index}` finds `i`.
@group(0) @binding(1) var<storage, read> parts: array<f32>;
{output}{entry} {
    {index}
    let total = params[0];
    if (i >= total) { return; }
    var acc = 0.0;
    for (var s = 0u; s < params[1]; s = s + 1u) { acc = acc + parts[s * total + i]; }
    store_out(params[2] + i, acc);
}
