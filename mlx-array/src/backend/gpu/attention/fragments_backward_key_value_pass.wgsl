//! A template, filled by `main` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{x}`, `{y}`, `{dk_decl}`, `{dv_decl}`, `{w1}`, `{w2}`, `{rows_stage}`, `{scores}`, `{probs}`, `{d_values}`, `{d_probs}`, `{d_scores}`, `{d_keys}`, `{out_k}`.
    let k0 = own0;
    // Key/value head `hi`, read as its group's first query head's.
    let bh0 = bi * h() + hi * group();
    {
        let bh = bh0;
{x}{y}    }
{dk_decl}{dv_decl}
    // dK and dV sum over the group's query heads.
    for (var bh = bh0; bh < bh0 + group(); bh = bh + 1u) {
    for (var q0 = first_query(k0) / BQ * BQ; q0 < lq(); q0 = q0 + BQ) {
        workgroupBarrier();
{w1}{w2}{rows_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{probs}
        workgroupBarrier();
{d_values}{d_probs}
        workgroupBarrier();
{d_scores}
        workgroupBarrier();
{d_keys}
    }
    }
    workgroupBarrier();
{out_k}{out_v}}
