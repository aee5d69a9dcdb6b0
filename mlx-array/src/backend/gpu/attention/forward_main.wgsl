//! A template, filled by `source` (attention/forward.rs) through `codegen::fill`;
//! its placeholders: `{QUERY_BLOCK}`, `{SIDE}`, `{q_stage}`, `{o_decl}`, `{k_stage}`, `{s_decl}`, `{s_steps}`, `{s_store}`, `{v_stage}`, `{kp}`, `{parts}`, `{ss}`, `{max_steps}`, `{merge_max}`, `{exp_steps}`, `{merge_sum}`, `{o_rescale}`, `{pv_steps}`, `{o_store}`.
 {
{QUERY_BLOCK}    let tx = lid % {SIDE}u;
    let ty = lid / {SIDE}u;
    {q_stage}
    if (lid < BQ) {
        m_s[lid] = neg_inf();
        l_s[lid] = 0.0;
    }
{o_decl}
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {
        workgroupBarrier();
        {k_stage}
        workgroupBarrier();
{s_decl}
{s_steps}
{s_store}
        workgroupBarrier();
        {v_stage}
        // Row `sr`'s keys `kb..kb + {kp}` for this invocation.
        let sr = lid / {parts}u;
        let at = sr * {ss}u + (lid % {parts}u) * {kp}u;
        let first = sr * {parts}u;
        let m_old = m_s[sr];
        {
            var mx = m_old;
{max_steps}
            red_s[lid] = mx;
        }
        workgroupBarrier();
        var mx = m_old;
        {
{merge_max}
        }
        var sum = 0.0;
        {
{exp_steps}
        }
        workgroupBarrier();
        red_s[lid] = sum;
        workgroupBarrier();
        if (lid % {parts}u == 0u) {
            var total = 0.0;
{merge_sum}
            // Every row sees key 0, so mx is finite from the first block on.
            let alpha = exp(m_old - mx);
            a_s[sr] = alpha;
            l_s[sr] = l_s[sr] * alpha + total;
            m_s[sr] = mx;
        }
        workgroupBarrier();
{o_rescale}
{pv_steps}
    }
{o_store}
    if (lid < BQ && q0 + lid < lq()) {
        store_out(b() * h() * lq() * DV + bh * lq() + q0 + lid, m_s[lid] + log(l_s[lid]));
    }
}
