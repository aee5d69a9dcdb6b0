//! A template, filled by `source` (matmul/tiled.rs) through `codegen::fill`;
//! its placeholders: `{total_a}`, `{total_b}`, `{entry}`, `{index}`, `{prologue}`, `{tx}`, `{bm}`, `{bn}`, `{decl}`, `{regs}`, `{fetch}`, `{put}`, `{wa4}`, `{wb4}`, `{fma}`, `{flip}`, `{words_a}`, `{words_b}`, `{wait}`.

var<workgroup> sa4: array<vec4<f32>, {total_a}>;
var<workgroup> sb4: array<vec4<f32>, {total_b}>;
{entry} {
    {index}
    if (g >= params[6]) { return; }
{prologue}
    let tx = lid % {tx}u;
    let ty = lid / {tx}u;
    let row_base = tm * {bm}u;
    let col_base = tn * {bn}u;
{decl}{regs}
    var k0 = 0u;
    var buf = 0u;
    {
        let kf = 0u;
        let nbuf_a = 0u;
        let nbuf_b = 0u;
{fetch}{put}    }
    workgroupBarrier();
    loop {
        if (k0 >= k) { break; }
        let abase = buf * {wa4}u;
        let bbase = buf * {wb4}u;
        let kf = k0 + 16u;
        let next = kf < k;
        if (next) {
{fetch}        }
{fma}        let nbuf = {flip};
        let nbuf_a = nbuf * {words_a}u;
        let nbuf_b = nbuf * {words_b}u;
{wait}        if (next) {
{put}        }
        buf = nbuf;
        k0 = kf;
        workgroupBarrier();
    }
    let ob = params[13] + bi * m * n;
{store}}
