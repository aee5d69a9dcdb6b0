//! A template, filled by `source` (attention/backward.rs) through `codegen::fill`;
//! its placeholders: `{q_len}`, `{g_len}`, `{k_len}`, `{v_len}`, `{p_len}`.

var<workgroup> q_s: array<vec4<f32>, {q_len}>;
var<workgroup> g_s: array<vec4<f32>, {g_len}>;
var<workgroup> k_s: array<vec4<f32>, {k_len}>;
var<workgroup> v_s: array<vec4<f32>, {v_len}>;
var<workgroup> p_s: array<f32, {p_len}>;
var<workgroup> ds_s: array<f32, {p_len}>;
var<workgroup> lse_s: array<f32, BQ>;
var<workgroup> dl_s: array<f32, BQ>;
