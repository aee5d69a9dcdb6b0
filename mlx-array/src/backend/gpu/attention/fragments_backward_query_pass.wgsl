//! A template, filled by `main` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{x}`, `{y}`, `{rows_stage}`, `{dq_decl}`, `{w1}`, `{w2}`, `{scores}`, `{probs}`, `{d_probs}`, `{d_scores}`, `{d_queries}`.
    let q0 = own0;
    let bh = bi * h() + hi;
{x}{y}{rows_stage}{dq_decl}
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {
        workgroupBarrier();
{w1}{w2}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{probs}
        workgroupBarrier();
{d_probs}
        workgroupBarrier();
{d_scores}
        workgroupBarrier();
{d_queries}
    }
    workgroupBarrier();
{out_q}}
