//! A template, filled by `source` (matmul/coop/mod.rs) through
//! `codegen::fill`: the cooperative product kernel of `{inv}` invocations,
//! its staged slices (`{sa_len}`, `{sb_len}` halves) and f32 staging
//! (`{stage_len}`), the prologue `{prologue}`, the lanes `{lanes}`, the
//! subgroups' `{wm}` x `{wn}` blocks on `{sg_cols}` columns of the
//! `{bm}` x `{bn}` tile, the declarations `{decl}` and `{regs}`, the main
//! loop `{main_loop}` and the stores `{epilogue}`.

var<workgroup> sa: array<f16, {sa_len}>;
var<workgroup> sb: array<f16, {sb_len}>;
var<workgroup> stage: array<f32, {stage_len}>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nw.x;
    if (g >= params[6]) { return; }
{prologue}
    let sg = lid / 32u;
    let lane = lid % 32u;
    {lanes}    let wr = (sg / {sg_cols}u) * {wm}u;
    let wc = (sg % {sg_cols}u) * {wn}u;
    let row_base = tm * {bm}u;
    let col_base = tn * {bn}u;
{decl}{regs}
{main_loop}    let ob = params[13] + bi * m * n;
{epilogue}}
