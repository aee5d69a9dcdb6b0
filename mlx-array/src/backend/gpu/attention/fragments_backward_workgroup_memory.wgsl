//! A template, filled by `source` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{x_len}`, `{y_len}`, `{w1_len}`, `{w2_len}`, `{st_len}`, `{p_len}`, `{inv}`.

var<workgroup> x_s: array<f16, {x_len}>;
var<workgroup> y_s: array<f16, {y_len}>;
var<workgroup> w1_s: array<f16, {w1_len}>;
var<workgroup> w2_s: array<f16, {w2_len}>;
var<workgroup> st: array<f32, {st_len}>;
var<workgroup> p_s: array<f16, {p_len}>;
var<workgroup> lse_s: array<f32, BQ>;
var<workgroup> dl_s: array<f32, BQ>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wg = wid.x + wid.y * nw.x;
