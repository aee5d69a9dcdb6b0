//! A template, filled by `lse_prologue` (loss/rows.rs) through `codegen::fill`;
//! its placeholders: `{x_at}`.
var<workgroup> red: array<f32, 256>;
fn x_at(j: u32) -> f32 { {x_at} }
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nw.x;
    let rows = params[0];
    if (row >= rows) { return; }
    let vocab = params[1];
    let base = params[2] + row * vocab;
    var m = bitcast<f32>(0xff800000u);
    for (var j = lid; j < vocab; j = j + 256u) { m = max(m, x_at(base + j)); }
    red[lid] = m;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    m = red[0];
    workgroupBarrier();
    var acc = 0.0;
    if (m != bitcast<f32>(0xff800000u)) {
        for (var j = lid; j < vocab; j = j + 256u) { acc = acc + exp(x_at(base + j) - m); }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
        workgroupBarrier();
    }
    var lse = m;
    if (m != bitcast<f32>(0xff800000u)) { lse = m + log(red[0]); }
    let total = red[0];
