//! A template, filled by `stats_source` (loss/linear.rs) through
//! `codegen::fill`: the body of the entry point (after
//! `codegen::GROUP_ENTRY`), with `{index}` the group index, `{max_walk}`
//! and `{sum_walk}` the unrolled walks over a row, and `{IGNORED}` the
//! resolved target of an ignored row.
 {
    {index}
    let row = g;
    if (row >= params[0]) { return; }
    let n = params[1];
    let c0 = params[2];
    let first = params[3] != 0u;
    let last = params[4] != 0u;
    let vocab = params[5];
    let sm = bitcast<f32>(params[6]);
    let ninf = bitcast<f32>(0xff800000u);
    let base = row * n;
    let t = tg[params[7] + row];
    var m0 = ninf;
    var s0 = 0.0;
    var xt = 0.0;
    var tot = 0.0;
    if (!first) {
        m0 = stats[row * 4u];
        s0 = stats[row * 4u + 1u];
        xt = stats[row * 4u + 2u];
        tot = stats[row * 4u + 3u];
    }
    let k = lid;
    var pm = ninf;
{max_walk}    let m = max(m0, reduce_max(pm, lid));
    var pe = 0.0;
    var ps = 0.0;
    if (m != ninf) {
{sum_walk}    }
    let fresh = reduce_sum(pe, lid);
    let chunk_total = reduce_sum(ps, lid);
    if (lid != 0u) { return; }
    if (m != ninf) {
        var carried = 0.0;
        if (m0 != ninf) { carried = s0 * exp(m0 - m); }
        s0 = carried + fresh;
        m0 = m;
        if (t >= c0 && t < c0 + n) { xt = x[base + t - c0]; }
        tot = tot + chunk_total;
    }
    stats[row * 4u] = m0;
    stats[row * 4u + 1u] = s0;
    stats[row * 4u + 2u] = xt;
    stats[row * 4u + 3u] = tot;
    if (last) {
        var loss = m0 + log(s0) - (1.0 - sm) * xt - sm * tot / f32(vocab);
        if (t == {IGNORED}u) { loss = 0.0; } else if (t >= vocab) { loss = bitcast<f32>(0x7fc00000u); }
        out[params[7] + row] = loss;
    }
}
