//! A template, filled by `rms_norm_grad` (norm/mod.rs) through `codegen::fill`;
//! its placeholders: `{index}`, `{walk}`.
 {
    {index}
    let width = params[1];
    if (i >= width) { return; }
    var acc = 0.0;
    let k = 0u;
{walk}    store_out(params[6] + i, acc);
}
