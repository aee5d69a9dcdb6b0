//! A template, filled by `softmax_source` (loss/rows.rs) through `codegen::fill`;
//! its placeholders: `{entry}`, `{index}`, `{rows}`, `{team}`, `{fold}`, `{half}`, `{write}`.
var<workgroup> part_m: array<f32, 256>;
var<workgroup> part_s: array<f32, 256>;
{entry} {
    {index}
    let NINF = bitcast<f32>(0xff800000u);
    let row = g * {rows}u + lid / {team}u;
    let k = lid % {team}u;
    let live = row < params[0];
    let base = params[2] + row * params[1];
    var m = NINF;
    var sum = 0.0;
    if (live) {
{fold}    }
    part_m[lid] = m;
    part_s[lid] = sum;
    workgroupBarrier();
    for (var h = {half}u; h > 0u; h = h >> 1u) {
        if (k < h) {
            let m1 = part_m[lid];
            let m2 = part_m[lid + h];
            let mm = max(m1, m2);
            var t = 0.0;
            if (mm != NINF) { t = part_s[lid] * exp(m1 - mm) + part_s[lid + h] * exp(m2 - mm); }
            part_m[lid] = mm;
            part_s[lid] = t;
        }
        workgroupBarrier();
    }
    m = part_m[lid - k];
    sum = part_s[lid - k];
    if (live) {
{write}    }
}
