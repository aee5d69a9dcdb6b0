fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
fn b() -> u32 { return params[0]; }
fn h() -> u32 { return params[1]; }
fn lq() -> u32 { return params[2]; }
fn lk() -> u32 { return params[3]; }
fn scale() -> f32 { return bitcast<f32>(params[5]); }
// Query heads per key/value head (grouped-query attention; 1 without),
// and the key/value heads.
fn group() -> u32 { return params[28]; }
fn hkv() -> u32 { return h() / group(); }
// The keys query `i` sees: 0..limit(i) (all keys for rows past lq).
fn limit(i: u32) -> u32 {
    if (params[4] == 0u) { return lk(); }
    return min(i + 1u + lk() - lq(), lk());
}
// The first query that sees key `j`.
fn first_query(j: u32) -> u32 {
    if (params[4] != 0u && j + lq() > lk()) { return j + lq() - lk(); }
    return 0u;
}
// The first element of row `l` of query head `bh` (batch `bh / h()`) of
// input `x` (0 q, 1 k, 2 v, 3 the cotangent), whose first element is `o`:
// k and v are read at the query head's key/value head.
fn row_of(x: u32, o: u32, bh: u32, l: u32) -> u32 {
    let s = 16u + 3u * x;
    var head = bh % h();
    if (x == 1u || x == 2u) { head = head / group(); }
    return o + (bh / h()) * params[s] + head * params[s + 1u] + l * params[s + 2u];
}
// The elements from one row of input `x` to the next.
fn row_step(x: u32) -> u32 { return params[18u + 3u * x]; }
