//! A template, filled by `run` (reduce/mod.rs) through `codegen::fill`:
//! the body of the entry point (after `codegen::GROUP_ENTRY`), one
//! workgroup per output, with `{index}` the group index and an
//! accumulator of type `{acc}` from `{init}`.
 {
    {index}
    let live = g < params[0];
    var acc: {acc} = {init};
    if (live) {
        let b = base(g);
        for (var r = lid; r < params[1]; r = r + 256u) {
            acc = merge(acc, value(b + at(r)));
        }
    }
    part[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { part[lid] = merge(part[lid], part[lid + s]); }
        workgroupBarrier();
    }
    if (live && lid == 0u) { store_out(g, finish(part[0])); }
}
