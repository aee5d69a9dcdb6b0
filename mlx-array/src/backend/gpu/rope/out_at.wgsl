
fn out_at(e: u32, at: u32) -> u32 {
    if (params[8] != 0u) { return at - params[9u + params[7]]; }
    return e;
}
