
fn atomic_add(k: u32, v: f32) {
    var old = atomicLoad(&out[k]);
    loop {
        let r = atomicCompareExchangeWeak(&out[k], old, bitcast<u32>(bitcast<f32>(old) + v));
        if (r.exchanged) { break; }
        old = r.old_value;
    }
}
