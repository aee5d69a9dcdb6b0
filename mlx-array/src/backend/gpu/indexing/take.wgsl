//! A template, filled by `take` (indexing/mod.rs) through `codegen::fill`;
//! its placeholders: `{zero}`.
    let post = params[2]; let nidx = params[1]; let len = params[3];
    let q = i % post; let r = i / post; let k = r % nidx; let p = r / nidx;
    let j = resolve(idx_at(vloc(k, params[5])), len);
    var v = {zero};
    if (j >= 0) { v = load_a(vloc((p * len + u32(j)) * post + q, params[4])); }
    store_out(i, v);
}
