//! The evaluator: deep graphs, detaching, freeing intermediates, memory accounting.
//! Memory counters are process-wide, so every test here takes one lock.

use std::sync::Mutex;

use mlx_array::{Array, Dtype, arange, eval, memory};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn deep_graph_of_100k_nodes_evaluates_and_drops_without_overflow() {
    let _g = serial();
    let mut x = arange(0.0, 4.0, 1.0, Dtype::F32).unwrap();
    for _ in 0..100_000 {
        x = x.add_scalar(1.0).unwrap();
    }
    assert_eq!(
        x.to_vec::<f32>().unwrap(),
        vec![100_000.0, 100_001.0, 100_002.0, 100_003.0]
    );
    // And a pending one that is never evaluated must drop without recursion.
    let mut y = arange(0.0, 4.0, 1.0, Dtype::F32).unwrap();
    for _ in 0..100_000 {
        y = y.mul_scalar(1.0).unwrap();
    }
    drop(y);
}

#[test]
fn evaluated_arrays_are_detached_and_shared_inputs_run_once() {
    let _g = serial();
    let a = arange(0.0, 3.0, 1.0, Dtype::F32).unwrap();
    let b = a.exp().unwrap();
    let c = b.add(&b).unwrap();
    let d = b.mul(&b).unwrap();
    eval((&c, &d)).unwrap();
    assert!(b.is_evaluated() && c.is_evaluated() && d.is_evaluated());
    assert_eq!(c.primitive_name(), None);
    let e: Vec<f32> = (0..3).map(|i| (i as f32).exp()).collect();
    let cv = c.to_vec::<f32>().unwrap();
    for i in 0..3 {
        assert!((cv[i] - 2.0 * e[i]).abs() < 1e-5);
    }
}

#[test]
fn intermediates_are_freed_as_soon_as_their_consumer_has_run() {
    let _g = serial();
    let n = 1 << 20; // 4 MiB of f32 per intermediate
    let x = arange(0.0, n as f64, 1.0, Dtype::F32).unwrap();
    x.eval().unwrap();
    memory::clear_cache();
    let base = memory::active();
    memory::reset_peak();
    // A chain of 20 elementwise ops: without freeing, 20 buffers would be live.
    let mut y = x.clone();
    for _ in 0..20 {
        y = y.mul_scalar(1.0001).unwrap().add_scalar(0.5).unwrap();
    }
    y.eval().unwrap();
    let extra_peak = memory::peak() - base;
    assert!(
        extra_peak <= 3 * 4 * n + (1 << 16),
        "peak grew by {extra_peak} bytes for a chain of 4 MiB buffers"
    );
    assert!(memory::active() - base <= 4 * n + (1 << 16));
    drop(y);
    assert!(
        memory::active() <= base + (1 << 16),
        "result buffer was not released"
    );
}

#[test]
fn binary_ops_write_over_an_input_nobody_else_reads() {
    let _g = serial();
    let n = 1 << 20;
    let x = arange(0.0, n as f64, 1.0, Dtype::F32).unwrap();
    x.eval().unwrap();
    memory::clear_cache();
    let base = memory::active();
    memory::reset_peak();
    // The first op must allocate (the test holds `x`); every later one is
    // its input's last reader and writes over it: one buffer in all.
    let mut y = x.mul_scalar(2.0).unwrap();
    for _ in 0..10 {
        y = y.add_scalar(1.0).unwrap().div_scalar(2.0).unwrap();
    }
    y.eval().unwrap();
    let extra_peak = memory::peak() - base;
    assert!(
        extra_peak <= 4 * n + (1 << 16),
        "peak grew by {extra_peak} bytes: a chain over one 4 MiB buffer allocated more"
    );
    let want = |v: f32| (0..10).fold(2.0 * v, |a, _| (a + 1.0) / 2.0);
    let got = y.to_vec::<f32>().unwrap();
    for i in [0, 1, n / 2, n - 1] {
        assert_eq!(got[i], want(i as f32));
    }
    // An intermediate somebody holds is never overwritten.
    let held = x.mul_scalar(3.0).unwrap();
    let after = held.add_scalar(1.0).unwrap().mul_scalar(2.0).unwrap();
    after.eval().unwrap();
    assert_eq!(held.to_vec::<f32>().unwrap()[7], 21.0);
    assert_eq!(after.to_vec::<f32>().unwrap()[7], 44.0);
    assert_eq!(x.to_vec::<f32>().unwrap()[7], 7.0);
}

#[test]
fn a_thousand_step_loop_keeps_active_memory_bounded() {
    let _g = serial();
    let mut w = arange(0.0, 4096.0, 1.0, Dtype::F32).unwrap();
    w.eval().unwrap();
    let mut highest = 0;
    let mut after_10 = 0;
    for step in 0..1000 {
        let g = w.mul_scalar(0.001).unwrap().sin().unwrap();
        w = w.subtract(&g).unwrap();
        w.eval().unwrap();
        if step == 10 {
            after_10 = memory::active();
        }
        highest = highest.max(memory::active());
    }
    assert!(
        highest <= after_10 + 4 * 4096 * 2,
        "active grew from {after_10} to {highest} bytes"
    );
}

#[test]
fn cache_holds_freed_buffers_until_cleared() {
    let _g = serial();
    memory::clear_cache();
    assert_eq!(memory::cache(), 0);
    let x = arange(0.0, 100_000.0, 1.0, Dtype::F32).unwrap();
    x.eval().unwrap();
    let before = memory::active();
    drop(x);
    assert!(memory::active() <= before - 400_000);
    assert!(memory::cache() >= 400_000);
    // Reuse: the same size comes back from the cache.
    let y = arange(0.0, 100_000.0, 1.0, Dtype::F32).unwrap();
    y.eval().unwrap();
    assert!(memory::cache() < 400_000);
    drop(y);
    memory::clear_cache();
    assert_eq!(memory::cache(), 0);
}

#[test]
fn errors_surface_from_eval_and_leave_the_graph_usable() {
    let _g = serial();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let bad = x
        .take(&Array::from_slice(&[5i32], &[1]).unwrap(), 0)
        .unwrap();
    let err = bad.eval().unwrap_err().to_string();
    assert!(err.contains("take") && err.contains("index 5"), "{err}");
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let _g = serial();
    let run = || {
        let k = mlx_array::random::key(7);
        let x = mlx_array::random::normal(&k, &[300, 300], Dtype::F32).unwrap();
        let y = x
            .matmul(&x.t().unwrap())
            .unwrap()
            .softmax(&[-1])
            .unwrap()
            .sum(&[0], false)
            .unwrap();
        y.to_vec::<f32>().unwrap()
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(run);
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
        .install(run);
    assert_eq!(one.len(), two.len());
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0));
    }
}

/// Grouped-query attention reads the key/value heads in place for their
/// groups: a forward and backward pass at `H_kv = H / 4` peaks below the
/// same pass at `H_kv = H` by at least the bytes of `k` and `v` it does
/// not have (its `dk` and `dv` are that much smaller), where a repeated
/// copy of `k` and `v` (and a sum of expanded `dk` and `dv`) would bring
/// it back up to about multi-head attention's; and `dk`, `dv` come back
/// in `k`'s and `v`'s own shapes.
#[test]
fn grouped_query_attention_holds_no_repeated_keys_or_values() {
    let _g = serial();
    let (b, h, l, d) = (1, 8, 256, 32);
    let extra_peak = |hkv: usize| {
        let x = |heads: usize, seed: u64| {
            let k = mlx_array::random::key(seed);
            let x = mlx_array::random::normal(&k, &[b, heads, l, d], Dtype::F32).unwrap();
            x.eval().unwrap();
            x
        };
        let inputs = [x(h, 1), x(hkv, 2), x(hkv, 3)];
        let ct = x(h, 4);
        memory::clear_cache();
        let base = memory::active();
        memory::reset_peak();
        let attend = |x: &[Array]| {
            Ok(vec![mlx_array::fused_attention(
                &x[0], &x[1], &x[2], 0.125, true,
            )?])
        };
        let (out, grads) = mlx_array::vjp(attend, &inputs, &[ct]).unwrap();
        eval((&out, &grads)).unwrap();
        for (g, x) in grads.iter().zip(&inputs) {
            assert_eq!(g.shape(), x.shape(), "hkv {hkv}: a gradient's shape");
        }
        memory::peak() - base
    };
    let kv_bytes = |heads: usize| 2 * b * heads * l * d * 4;
    let (mha, gqa) = (extra_peak(h), extra_peak(h / 4));
    assert!(
        mha >= gqa + kv_bytes(h) - kv_bytes(h / 4),
        "multi-head peak {mha} B, grouped-query {gqa} B: less than the {} B of k and v apart",
        kv_bytes(h) - kv_bytes(h / 4)
    );
}
