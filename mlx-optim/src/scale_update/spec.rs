//! Conformance specification of the loss scale's update
//! (`loss_scale_update`).
//!
//! Values: over flags (0, 1, 3, NaN), scales (2^16, 3, 2^127, 2^-125 and
//! the smallest normal float32), counts of good steps (0, 1, one short of
//! the interval) and intervals (1, 2, 2000, 2^24), the four results equal
//! the op-by-op graph the primitive replaces, bit for bit, on the device
//! under test. Then a run of 40 steps with overflows at chosen steps
//! follows the host's [`LossScaler`] exactly: the scale, the count of good
//! steps and each step's outcome.
//!
//! Gradients: the update is not differentiated; differentiating through it
//! is refused, naming the primitive.

use mlx_array::conformance::*;
use mlx_array::{Array, Dtype, where_};

use super::{ScaleUpdate, update};
use crate::LossScaler;

/// The primitive's specification.
pub(crate) fn specs() -> Vec<Spec> {
    vec![Spec::new::<ScaleUpdate>(
        "loss_scale_update",
        values,
        || {
            let inputs = vec![
                Array::full(&[], 0.0, Dtype::F32),
                Array::full(&[], 8.0, Dtype::F32),
                Array::full(&[], 1.0, Dtype::F32),
            ];
            GradCase::new(inputs, &[1], |a| Ok(update(&a[0], &a[1], &a[2], 4)?.scale)).refused()
        },
    )]
}

/// The op-by-op graph of the update (what `DeviceLossScaler::check` built
/// before the primitive): `[finite, scale', good', 1 / scale']`.
fn composite(flag: &Array, scale: &Array, good: &Array, interval: u64) -> [Array; 4] {
    let c = |v: f64| Array::full(&[], v, Dtype::F32);
    let (zero, one) = (c(0.0), c(1.0));
    let run = || -> mlx_array::Result<[Array; 4]> {
        let finite = flag.equal(&zero)?.astype(Dtype::F32)?;
        let good = where_(&finite, &good.add(&one)?, &zero)?;
        let grow = good.greater_equal(&c(interval as f64))?;
        let kept = where_(&grow, &scale.mul(&c(2.0))?, scale)?;
        let halved = scale
            .mul(&c(0.5))?
            .maximum(&c(f64::from(f32::MIN_POSITIVE)))?;
        let scale = where_(&finite, &kept, &halved)?;
        let good = where_(&grow, &zero, &good)?;
        let inverse = one.div(&scale)?;
        Ok([finite, scale, good, inverse])
    };
    run().expect("the op-by-op update")
}

fn bits(a: &Array) -> u32 {
    a.item::<f32>().expect("a scalar").to_bits()
}

fn values(cx: &Ctx) {
    let scalar = |v: f32| Array::full(&[], f64::from(v), Dtype::F32);
    let flags = [0.0, 1.0, 3.0, f32::NAN];
    let scales = [
        65536.0,
        3.0,
        2f32.powi(127),
        2f32.powi(-125),
        f32::MIN_POSITIVE,
    ];
    for interval in [1u64, 2, 2000, 1 << 24] {
        let counts = [0.0, 1.0, interval as f32 - 1.0];
        for flag in flags {
            for scale in scales {
                for good in counts {
                    let what = format!(
                        "flag {flag}, scale {scale:e}, {good} good steps, interval {interval} on {}",
                        cx.device()
                    );
                    let (got, want) = cx.on(|| {
                        let [f, s, g] = [flag, scale, good].map(scalar);
                        let got = update(&f, &s, &g, interval).expect("update");
                        let got = [got.finite, got.scale, got.good_steps, got.inverse];
                        (got, composite(&f, &s, &g, interval))
                    });
                    mlx_array::eval((&got[..], &want[..])).expect("evaluates");
                    for (k, name) in ["finite", "scale", "good steps", "inverse"]
                        .iter()
                        .enumerate()
                    {
                        assert_eq!(got[k].device(), cx.device(), "{what}: {name} placed");
                        assert_eq!(bits(&got[k]), bits(&want[k]), "{what}: {name}");
                    }
                }
            }
        }
    }

    // A run against the host's scaler.
    let mut host = LossScaler::with(1024.0, 3);
    let (mut s, mut g) = cx.on(|| (scalar(1024.0), scalar(0.0)));
    for t in 0..40u32 {
        let overflow = [4, 5, 6, 20].contains(&t) || t % 11 == 10;
        let flag = cx.on(|| scalar(if overflow { 2.0 } else { 0.0 }));
        let u = cx.on(|| update(&flag, &s, &g, 3)).expect("update");
        mlx_array::eval((&u.finite, &u.scale, &u.good_steps, &u.inverse)).expect("evaluates");
        let applied = host.update(!overflow);
        let what = format!("step {t} on {}", cx.device());
        assert_eq!(
            u.finite.item::<f32>().expect("finite"),
            f32::from(u8::from(applied)),
            "{what}"
        );
        assert_eq!(
            f64::from(u.scale.item::<f32>().expect("scale")),
            host.scale(),
            "{what}: scale"
        );
        assert_eq!(
            u.good_steps.item::<f32>().expect("good") as u64,
            host.good_steps(),
            "{what}: good steps"
        );
        assert_eq!(
            f64::from(u.inverse.item::<f32>().expect("inverse")),
            1.0 / host.scale(),
            "{what}: inverse"
        );
        (s, g) = (u.scale, u.good_steps);
    }
}
