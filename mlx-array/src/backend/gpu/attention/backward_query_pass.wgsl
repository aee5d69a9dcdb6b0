//! A template, filled by `source` (attention/backward.rs) through `codegen::fill`;
//! its placeholders: `{q_stage}`, `{g_stage}`, `{rows_stage}`, `{acc_decl}`, `{k_stage}`, `{v_stage}`, `{scores}`, `{acc_steps}`, `{store}`.
    let q0 = start;
    let bh = bi * h() + hi;
    {q_stage}
    {g_stage}
    {rows_stage}
{acc_decl}
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {
        workgroupBarrier();
        {k_stage}
        {v_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{acc_steps}
    }
{store}
}
