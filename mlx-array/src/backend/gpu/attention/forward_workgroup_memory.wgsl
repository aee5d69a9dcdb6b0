//! A template, filled by `source` (attention/forward.rs) through `codegen::fill`;
//! its placeholders: `{q_len}`, `{kv_len}`, `{s_len}`, `{INVOCATIONS}`.

var<workgroup> q_s: array<vec4<f32>, {q_len}>;
var<workgroup> kv_s: array<vec4<f32>, {kv_len}>;
var<workgroup> s_s: array<f32, {s_len}>;
var<workgroup> m_s: array<f32, BQ>;
var<workgroup> l_s: array<f32, BQ>;
var<workgroup> a_s: array<f32, BQ>;
var<workgroup> red_s: array<f32, {INVOCATIONS}>;
