//! The reference Llama's step projected onto more hosts from the ring's
//! alpha-beta fits, per link rate.

use crate::alpha_beta::{self, Fit, Projection};

use super::results::RateFits;

/// The projection of every `(rate, hosts)`, with the model's parameters.
pub(super) struct Projections {
    /// Which fits the parameters come from: `world N` (the smallest world's)
    /// or `every world`.
    pub(super) over: String,
    /// The highest link efficiency measured (its rate and value), for the
    /// second variant; `None` with one measured rate.
    pub(super) best: Option<(String, f64)>,
    pub(super) rates: Vec<ProjectedRate>,
}

/// One projected link rate.
pub(super) struct ProjectedRate {
    pub(super) name: String,
    /// The measured rate whose fit gives alpha and the link efficiency.
    pub(super) from: String,
    pub(super) alpha: f64,
    /// The link efficiency of that fit: (1/beta) / link rate.
    pub(super) efficiency: f64,
    pub(super) beta: f64,
    /// beta at the best efficiency measured (when another fit has it).
    pub(super) beta_best: Option<f64>,
    pub(super) rows: Vec<(Projection, Option<Projection>)>,
    /// Every host count from 2 to the largest, for the chart.
    pub(super) curve: Vec<Projection>,
}

/// Link efficiency of a fit: the bus bandwidth it reaches over the link rate.
pub(super) fn efficiency(fit: &Fit, bits: u64) -> f64 {
    (1.0 / fit.beta) / (bits as f64 / 8.0)
}

/// The fit a projection uses at one measured rate: its smallest world's,
/// whose ranks each have a core of their own here (four ranks on two cores
/// measure this machine's CPU at 10 Gbit/s, not the link), else the fit over
/// every world.
fn base_fit(f: &RateFits) -> Option<(Fit, String)> {
    let smallest = f.per_world.iter().min_by_key(|(w, _)| *w);
    match smallest {
        Some((w, Some(x))) => Some((*x, format!("world {w}"))),
        _ => f.joint.map(|x| (x, "every world".to_string())),
    }
}

/// Projects every rate of `project` onto every host count of `hosts`. Each
/// projected rate takes alpha and the link efficiency e from the fit at the
/// fastest measured rate not above it (else the slowest measured), and
/// beta = 1 / (e x rate); the second variant takes the best e measured.
pub(super) fn project_all(
    fits: &[RateFits],
    project: &[(String, u64)],
    hosts: &[usize],
    grad_bytes: u64,
    compute_s: f64,
) -> Option<Projections> {
    let with_fit: Vec<(&RateFits, Fit, String)> = fits
        .iter()
        .filter_map(|f| base_fit(f).map(|(x, over)| (f, x, over)))
        .filter(|(_, x, _)| x.beta > 0.0)
        .collect();
    let slowest = with_fit.iter().min_by_key(|(f, _, _)| f.bits)?;
    let best = with_fit
        .iter()
        .map(|(f, x, _)| (f, efficiency(x, f.bits)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|_| with_fit.len() > 1)
        .map(|(f, e)| (f.rate.clone(), e, f.bits));
    let max_hosts = hosts.iter().copied().max().unwrap_or(2).max(2);
    let rates = project
        .iter()
        .map(|(name, bits)| {
            let (f, fit, _) = with_fit
                .iter()
                .filter(|(f, _, _)| f.bits <= *bits)
                .max_by_key(|(f, _, _)| f.bits)
                .unwrap_or(slowest);
            let e = efficiency(fit, f.bits);
            let beta = 1.0 / (e * *bits as f64 / 8.0);
            let beta_best = best
                .as_ref()
                .filter(|(_, _, b)| *b != f.bits)
                .map(|(_, eb, _)| 1.0 / (eb * *bits as f64 / 8.0));
            let p = |b: f64, h: usize| {
                alpha_beta::project(fit.alpha, b, grad_bytes as f64, compute_s, h)
            };
            ProjectedRate {
                name: name.clone(),
                from: f.rate.clone(),
                alpha: fit.alpha,
                efficiency: e,
                beta,
                beta_best,
                rows: hosts
                    .iter()
                    .map(|&h| (p(beta, h), beta_best.map(|bb| p(bb, h))))
                    .collect(),
                curve: (2..=max_hosts).map(|h| p(beta, h)).collect(),
            }
        })
        .collect();
    Some(Projections {
        over: slowest.2.clone(),
        best: best.map(|(r, e, _)| (r, e)),
        rates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_projected_rate_takes_the_nearest_measured_fit_below() {
        let fit = |alpha: f64, beta: f64| Fit {
            alpha,
            beta,
            rms_rel: 0.0,
            max_rel: 0.0,
            samples: 10,
        };
        let fits = [
            RateFits {
                rate: "10gbit".into(),
                bits: 10_000_000_000,
                joint: Some(fit(50e-6, 1.6e-9)), // 0.625 GB/s: 50% of the link
                per_world: vec![],
            },
            RateFits {
                rate: "1gbit".into(),
                bits: 1_000_000_000,
                joint: Some(fit(80e-6, 8.4e-9)), // 95.2% of the link
                per_world: vec![],
            },
        ];
        let rates = [
            ("100mbit".to_string(), 100_000_000),
            ("1gbit".to_string(), 1_000_000_000),
            ("100gbit".to_string(), 100_000_000_000),
        ];
        let p = project_all(&fits, &rates, &[8, 64], 1 << 30, 1.0).unwrap();
        let from: Vec<&str> = p.rates.iter().map(|r| r.from.as_str()).collect();
        assert_eq!(from, ["1gbit", "1gbit", "10gbit"]);
        assert_eq!(p.over, "every world");
        let best = p.best.clone().unwrap();
        assert_eq!(best.0, "1gbit");
        assert!((best.1 - 1.0 / 8.4e-9 / 125e6).abs() < 1e-12);
        // 100 Gbit/s at the 10gbit fit's 50%: 6.25 GB/s, alpha from that fit.
        let r = &p.rates[2];
        assert_eq!(r.alpha, 50e-6);
        assert!((1.0 / r.beta / 1e9 - 6.25).abs() < 1e-9);
        let (x, best) = &r.rows[1];
        assert_eq!(x.hosts, 64);
        let expect = alpha_beta::predict(50e-6, r.beta, 64, (1u64 << 30) as f64);
        assert!((x.comm_s - expect).abs() < 1e-12);
        assert!(
            best.unwrap().comm_s < x.comm_s,
            "1gbit's efficiency is higher"
        );
        assert_eq!(r.curve.len(), 63);
        // The 1gbit projection is its own fit: no second variant.
        assert!(p.rates[1].rows[0].1.is_none());
        assert!((p.rates[1].beta - 8.4e-9).abs() < 1e-18);
        assert!(project_all(&[], &[], &[8], 1, 1.0).is_none());
        // With fits per world, the smallest world's is used.
        let mut fits = fits;
        fits[0].per_world = vec![(4, Some(fit(90e-6, 4e-9))), (2, Some(fit(20e-6, 1e-9)))];
        let p = project_all(&fits, &[("10gbit".into(), 10_000_000_000)], &[8], 1, 1.0).unwrap();
        assert_eq!(p.rates[0].alpha, 20e-6);
    }
}
