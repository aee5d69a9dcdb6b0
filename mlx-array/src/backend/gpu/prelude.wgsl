
fn bf16_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
// f32 to f16 bits, rounded to nearest even in integer arithmetic, so that
// every driver rounds alike (WGSL leaves the rounding of `f16(v)` and of
// `pack2x16float` to the implementation) and as the CPU does; magnitudes
// from 65520 on become infinities, NaN a quiet NaN of the same sign.
fn f16_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return s | 0x7e00u; }
    if (a >= 0x477ff000u) { return s | 0x7c00u; }
    if (a >= 0x38800000u) {
        return s | ((a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u);
    }
    if (a <= 0x33000000u) { return s; }
    let e = a >> 23u;
    let m = (a & 0x7fffffu) | 0x800000u;
    let sh = 126u - e;
    let q = m >> sh;
    let rem = m & ((1u << sh) - 1u);
    let half = 1u << (sh - 1u);
    return s | (q + select(0u, 1u, rem > half || (rem == half && (q & 1u) == 1u)));
}
fn round_f16(v: f32) -> f32 {
    return unpack2x16float(f16_bits(v)).x;
}
fn round_bf16(v: f32) -> f32 {
    return bitcast<f32>(bf16_bits(v) << 16u);
}
