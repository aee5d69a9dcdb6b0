//! The latency-bandwidth (alpha-beta) model of the ring all_sum, its fit to
//! measurements, and the projection of a data-parallel step onto more hosts.
//!
//! A ring all_sum of `bytes` over `n` ranks takes `2(n-1)` steps, each of
//! which moves `bytes / n` over every link at once, so
//!
//! ```text
//! time(n, bytes) = 2(n-1) * alpha + 2(n-1)/n * bytes * beta
//! ```
//!
//! with `alpha` the cost of a step (latency, software) and `beta` seconds
//! per byte on one link (`1 / beta` is the bus bandwidth the ring reaches).
//! [`fit`] finds both by least squares on the relative error (each
//! measurement weighs `1 / time^2`), so that the microsecond latencies of
//! small messages count as much as the seconds of large ones.

/// One measured all_sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Ranks.
    pub n: usize,
    /// Message size.
    pub bytes: f64,
    /// Seconds per all_sum.
    pub secs: f64,
}

/// A fitted model and how well it fits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Seconds per ring step.
    pub alpha: f64,
    /// Seconds per byte on a link.
    pub beta: f64,
    /// Root mean square of the relative errors `(model - measured) / measured`.
    pub rms_rel: f64,
    /// The largest relative error, in absolute value.
    pub max_rel: f64,
    /// Measurements fitted.
    pub samples: usize,
}

/// The model's two regressors for `n` ranks and `bytes`: steps and bus bytes.
fn regressors(n: usize, bytes: f64) -> (f64, f64) {
    let steps = 2.0 * (n as f64 - 1.0);
    (steps, steps / n as f64 * bytes)
}

/// The model's time for an all_sum of `bytes` over `n` ranks.
pub fn predict(alpha: f64, beta: f64, n: usize, bytes: f64) -> f64 {
    let (x1, x2) = regressors(n, bytes);
    alpha * x1 + beta * x2
}

/// Least squares on the relative error, with `alpha, beta >= 0` (a
/// parameter the unconstrained solution makes negative is fixed at 0 and the
/// other refitted alone). `None` with fewer than two usable samples (`n >= 2`,
/// positive time) or when the samples cannot separate the two parameters.
pub fn fit(samples: &[Sample]) -> Option<Fit> {
    let usable: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.n >= 2 && s.secs > 0.0 && s.bytes >= 0.0 && s.secs.is_finite())
        .collect();
    if usable.len() < 2 {
        return None;
    }
    // Weighted normal equations, weight 1/t^2: [a b; b c] [alpha beta]' = [d e]'.
    let (mut a, mut b, mut c, mut d, mut e) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in &usable {
        let (x1, x2) = regressors(s.n, s.bytes);
        let w = 1.0 / (s.secs * s.secs);
        a += w * x1 * x1;
        b += w * x1 * x2;
        c += w * x2 * x2;
        d += w * x1 * s.secs;
        e += w * x2 * s.secs;
    }
    let det = a * c - b * b;
    if det.is_nan() || det.abs() <= 1e-12 * a * c {
        return None;
    }
    let (mut alpha, mut beta) = ((d * c - b * e) / det, (a * e - b * d) / det);
    if alpha < 0.0 {
        alpha = 0.0;
        beta = e / c;
    } else if beta < 0.0 {
        beta = 0.0;
        alpha = d / a;
    }
    let rel: Vec<f64> = usable
        .iter()
        .map(|s| (predict(alpha, beta, s.n, s.bytes) - s.secs) / s.secs)
        .collect();
    let rms_rel = (rel.iter().map(|r| r * r).sum::<f64>() / rel.len() as f64).sqrt();
    let max_rel = rel.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    Some(Fit {
        alpha,
        beta,
        rms_rel,
        max_rel,
        samples: usable.len(),
    })
}

/// The reference Llama's parameters (4 layers, dims 256, 4 heads, MLP 512,
/// vocabulary 50,257; mlx-llama's `LlamaConfig::default()`): the embedding
/// and the output projection are separate matrices (untied), no layer has a
/// bias, each block has two RMSNorm weights, and a final RMSNorm closes.
pub fn reference_llama_parameters() -> u64 {
    let (vocab, dims, mlp, layers) = (50_257u64, 256u64, 512u64, 4u64);
    let embedding = vocab * dims;
    let out_proj = dims * vocab;
    let attention = 4 * dims * dims; // query, key, value, output
    let mlp = 3 * dims * mlp; // SwiGLU: two in, one out
    let norms = 2 * dims;
    embedding + out_proj + layers * (attention + mlp + norms) + dims
}

/// One projected configuration: a step of `compute_s` on every host, then an
/// all_sum of the gradients over `hosts` hosts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Projection {
    /// Hosts (ranks, one per host).
    pub hosts: usize,
    /// The all_sum of the gradients, seconds.
    pub comm_s: f64,
    /// Step time with no overlap: compute + comm.
    pub step_serial_s: f64,
    /// Step time with perfect overlap: max(compute, comm).
    pub step_overlap_s: f64,
    /// compute / step, no overlap (weak scaling: every host keeps its batch).
    pub eff_serial: f64,
    /// compute / step, perfect overlap.
    pub eff_overlap: f64,
}

/// Projects a step over `hosts` hosts: the gradients' all_sum from the model.
pub fn project(alpha: f64, beta: f64, grad_bytes: f64, compute_s: f64, hosts: usize) -> Projection {
    let comm_s = if hosts < 2 {
        0.0
    } else {
        predict(alpha, beta, hosts, grad_bytes)
    };
    let step_serial_s = compute_s + comm_s;
    let step_overlap_s = compute_s.max(comm_s);
    Projection {
        hosts,
        comm_s,
        step_serial_s,
        step_overlap_s,
        eff_serial: compute_s / step_serial_s,
        eff_overlap: compute_s / step_overlap_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(alpha: f64, beta: f64, noise: &[f64]) -> Vec<Sample> {
        let mut v = Vec::new();
        let mut k = 0;
        for n in [2, 4] {
            let mut bytes = 1024.0;
            while bytes <= (256u64 << 20) as f64 {
                let t = predict(alpha, beta, n, bytes) * (1.0 + noise[k % noise.len()]);
                v.push(Sample { n, bytes, secs: t });
                bytes *= 4.0;
                k += 1;
            }
        }
        v
    }

    #[test]
    fn exact_data_gives_back_the_parameters() {
        // 50 us per step, a 1 Gbit/s link (8 ns per byte).
        let (alpha, beta) = (50e-6, 8e-9);
        let f = fit(&synthetic(alpha, beta, &[0.0])).unwrap();
        assert!((f.alpha - alpha).abs() / alpha < 1e-9, "{f:?}");
        assert!((f.beta - beta).abs() / beta < 1e-9, "{f:?}");
        assert!(f.rms_rel < 1e-9 && f.max_rel < 1e-9);
        assert_eq!(f.samples, 20);
    }

    #[test]
    fn noisy_data_fits_within_the_noise() {
        let (alpha, beta) = (120e-6, 0.8e-9);
        let noise = [0.05, -0.04, 0.02, -0.03, 0.01, 0.0, -0.05, 0.03];
        let f = fit(&synthetic(alpha, beta, &noise)).unwrap();
        assert!((f.alpha - alpha).abs() / alpha < 0.1, "{f:?}");
        assert!((f.beta - beta).abs() / beta < 0.05, "{f:?}");
        assert!(f.rms_rel < 0.05 && f.max_rel < 0.1, "{f:?}");
    }

    #[test]
    fn parameters_stay_non_negative() {
        // Pure bandwidth: alpha 0; noise that would pull it below 0.
        let v = vec![
            Sample {
                n: 2,
                bytes: 1e3,
                secs: 0.9e-6,
            },
            Sample {
                n: 2,
                bytes: 1e6,
                secs: 1e-3,
            },
            Sample {
                n: 4,
                bytes: 1e6,
                secs: 1.5e-3,
            },
        ];
        let f = fit(&v).unwrap();
        assert_eq!(f.alpha, 0.0);
        assert!(f.beta > 0.0);
        // Too few usable samples, or only one world and size: nothing to fit.
        assert!(fit(&v[..1]).is_none());
        let same = [v[1], v[1]];
        assert!(fit(&same).is_none());
    }

    #[test]
    fn the_reference_llama_has_28_4m_parameters() {
        // BENCHMARKS.md ("Collectives on one host"): 28,355,328 f32 parameters.
        assert_eq!(reference_llama_parameters(), 28_355_328);
    }

    #[test]
    fn projection_with_and_without_overlap() {
        // 1 s of compute; comm 2(n-1)/n * 1e9 B at 1 ns/B plus 2(n-1) * 1 ms.
        let p = project(1e-3, 1e-9, 1e9, 1.0, 2);
        assert!((p.comm_s - (2e-3 + 1.0)).abs() < 1e-12);
        assert!((p.step_serial_s - 2.002).abs() < 1e-12);
        assert!((p.step_overlap_s - 1.002).abs() < 1e-12);
        assert!((p.eff_serial - 1.0 / 2.002).abs() < 1e-12);
        let one = project(1e-3, 1e-9, 1e9, 1.0, 1);
        assert_eq!(
            (one.comm_s, one.eff_serial, one.eff_overlap),
            (0.0, 1.0, 1.0)
        );
        // Overlap hides communication shorter than the compute.
        let p = project(1e-6, 1e-12, 1e9, 1.0, 64);
        assert_eq!(p.eff_overlap, 1.0);
        assert!(p.eff_serial < 1.0);
    }
}
