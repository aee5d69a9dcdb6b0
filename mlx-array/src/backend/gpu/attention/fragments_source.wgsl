//! A template, filled by `source` (attention/fragments.rs) through `codegen::fill`;
//! its placeholders: `{q_len}`, `{kv_len}`, `{p_len}`, `{s_len}`, `{halves}`, `{inv}`, `{QUERY_BLOCK}`, `{LANES}`, `{q_stage}`, `{o_decl}`, `{ss}`, `{k_stage}`, `{scores}`, `{v_stage}`, `{hk}`, `{ps}`, `{max_part}`, `{exp_part}`, `{pv}`, `{o_add}`, `{o_store}`.

var<workgroup> q_s: array<f16, {q_len}>;
var<workgroup> kv_s: array<f16, {kv_len}>;
var<workgroup> p_s: array<f16, {p_len}>;
var<workgroup> s_s: array<f32, {s_len}>;
var<workgroup> m_s: array<f32, BQ>;
var<workgroup> l_s: array<f32, BQ>;
var<workgroup> a_s: array<f32, BQ>;
var<workgroup> x_s: array<f32, {halves}>;
var<workgroup> y_s: array<f32, {halves}>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
{QUERY_BLOCK}    let sg = lid / 32u;
    let lane = lid % 32u;
    {LANES}
    // The subgroup's first row in the block.
    let row0 = sg * 16u;
{q_stage}
    if (lid < BQ) {
        m_s[lid] = neg_inf();
        l_s[lid] = 0.0;
    }
{o_decl}
    let orow = (row0 + prow) * {ss}u;
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {
        workgroupBarrier();
{k_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{v_stage}
        // The online softmax on all 32 lanes: row `row0 + lane % 16`, the
        // lane's half of the block's keys, unrolled; the halves' maxima and
        // sums meet in workgroup memory.
        let row = row0 + lane % 16u;
        let half = lane / 16u;
        let lim = limit(q0 + row);
        let srow = row * {ss}u + half * {hk}u;
        let prow_s = row * {ps}u + half * {hk}u;
        let kh = k0 + half * {hk}u;
        let m_old = m_s[row];
        var mx = m_old;
{max_part}        x_s[row * 2u + half] = mx;
        workgroupBarrier();
        mx = max(x_s[row * 2u], x_s[row * 2u + 1u]);
        var sum = 0.0;
{exp_part}        y_s[row * 2u + half] = sum;
        workgroupBarrier();
        if (half == 0u) {
            // Every row sees key 0, so mx is finite from the first block on.
            let alpha = exp(m_old - mx);
            a_s[row] = alpha;
            l_s[row] = l_s[row] * alpha + y_s[row * 2u] + y_s[row * 2u + 1u];
            m_s[row] = mx;
        }
{pv}
        workgroupBarrier();
        let alpha = a_s[row0 + prow];
{o_add}
    }
    let qi = q0 + row0 + prow;
    if (qi < lq()) {
        let inv_l = 1.0 / l_s[row0 + prow];
        let ob = ((bi * lq() + qi) * h() + hi) * DV;
{o_store}
    }
    let lrow = row0 + lane;
    if (lane < 16u && q0 + lrow < lq()) {
        store_out(b() * h() * lq() * DV + bh * lq() + q0 + lrow, m_s[lrow] + log(l_s[lrow]));
    }
}
