
    workgroupBarrier();
    for (var s = T / 2u; s > 0u; s = s >> 1u) {
        if (t < s) { part[lid] = part[lid] + part[lid + s]; }
        workgroupBarrier();
    }
