
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
fn erf_as(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
    return select(-y, y, x >= 0.0);
}
fn pow_signed(x: f32, y: f32) -> f32 {
    if (y == 0.0) { return 1.0; }
    if (x >= 0.0) { return pow(x, y); }
    if (floor(y) != y) { return bitcast<f32>(0x7fc00000u); }
    let m = pow(-x, y);
    return select(m, -m, (i32(y) & 1) == 1);
}
fn ipow(x: i32, y: i32) -> i32 {
    if (y < 0) { return select(select(0, select(-1, 1, (y & 1) == 0), x == -1), 1, x == 1); }
    var acc = 1; var b = x; var e = u32(y);
    loop { if (e == 0u) { break; } if ((e & 1u) == 1u) { acc = acc * b; } b = b * b; e = e >> 1u; }
    return acc;
}
fn upow(x: u32, y: u32) -> u32 {
    var acc = 1u; var b = x; var e = y;
    loop { if (e == 0u) { break; } if ((e & 1u) == 1u) { acc = acc * b; } b = b * b; e = e >> 1u; }
    return acc;
}
