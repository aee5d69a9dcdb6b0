//! A template, filled by `arg_reduce` (reduce/arg.rs) through
//! `codegen::fill`: the body of the entry point (after
//! `codegen::GROUP_ENTRY`), one workgroup per output, with `{index}` the
//! group index and `{t}` the values' type.
 {
    {index}
    let live = g < params[0];
    var bv: {t};
    var bi = EMPTY;
    if (live) {
        let b = base(g);
        for (var r = lid; r < params[1]; r = r + 256u) {
            let v = load_in0(u32(b + at(r)));
            if (take(bv, bi, v, r)) { bv = v; bi = r; }
        }
    }
    part_v[lid] = bv;
    part_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s && take(part_v[lid], part_i[lid], part_v[lid + s], part_i[lid + s])) {
            part_v[lid] = part_v[lid + s];
            part_i[lid] = part_i[lid + s];
        }
        workgroupBarrier();
    }
    if (live && lid == 0u) { store_out(g, part_i[0]); }
}
