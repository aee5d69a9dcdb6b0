fn resolve_target(v: i32, vocab: u32) -> i32 {
    return select(-1, v, v >= 0 && u32(v) < vocab);
}
