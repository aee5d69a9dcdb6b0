//! A template, filled by `rms_norm_grad` (norm/mod.rs) through `codegen::fill`;
//! its placeholders: `{index}`, `{CHUNK}`, `{walk}`.
 {
    {index}
    let width = params[1];
    if (i >= width * params[7]) { return; }
    let j = i % width;
    let chunk = i / width;
    let first = chunk * {CHUNK}u;
    let rows = min(params[0], first + {CHUNK}u) - first;
    var acc = 0.0;
    let k = 0u;
{walk}    store_out(i, acc);
}
