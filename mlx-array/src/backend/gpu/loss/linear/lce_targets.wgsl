//! A template, filled by `resolve_targets` (loss/linear.rs) through
//! `codegen::fill`: the body of the entry point (after `codegen::ENTRY`),
//! with `{index}` the thread index, `{IGNORED}` the resolved target of an
//! ignored row and `{bad}` that of a target out of range.
 {
    {index}
    if (i >= params[0]) { return; }
    let raw = bitcast<u32>(load_t(vloc(i, params[4])));
    var r = raw;
    if (params[2] != 0u && raw == params[3]) { r = {IGNORED}u; } else if (raw >= params[1]) { r = {bad}u; }
    out[i] = r;
}
