//! A template, filled by `source` (attention/backward.rs) through `codegen::fill`;
//! its placeholders: `{k_stage}`, `{v_stage}`, `{acc_decl}`, `{q_stage}`, `{g_stage}`, `{rows_stage}`, `{scores}`, `{acc_steps}`, `{store}`.
    let k0 = start;
    // Key/value head `hi`, read as its group's first query head's.
    let bh0 = bi * h() + hi * group();
    {
        let bh = bh0;
        {k_stage}
        {v_stage}
    }
{acc_decl}
    // dK and dV sum over the group's query heads.
    for (var bh = bh0; bh < bh0 + group(); bh = bh + 1u) {
    for (var q0 = first_query(k0) / BQ * BQ; q0 < lq(); q0 = q0 + BQ) {
        workgroupBarrier();
        {q_stage}
        {g_stage}
        {rows_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{acc_steps}
    }
    }
{store}
}
