//! A template, filled by `rows_source` (reduce/mod.rs) through
//! `codegen::fill`: `{team}` invocations a row, `{rows}` rows a workgroup,
//! folding with `merge` the loads of `{walk}` into an accumulator of type
//! `{acc}` from `{init}`; `{decl}` declares the input, `{entry}` and
//! `{index}` open the entry point, `{half}` is half the team.
{decl}var<workgroup> part: array<{acc}, 256>;
{entry} {
    {index}
    let row = g * {rows}u + lid / {team}u;
    let k = lid % {team}u;
    let live = row < params[0];
    var acc: {acc} = {init};
    if (live) {
        let b = base(row);
        let b4 = u32(b) / 4u;
{walk}    }
    part[lid] = acc;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {
        if (k < s) { part[lid] = merge(part[lid], part[lid + s]); }
        workgroupBarrier();
    }
    if (live && k == 0u) { store_out(row, finish(part[lid])); }
}
