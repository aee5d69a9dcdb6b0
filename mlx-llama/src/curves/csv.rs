//! `metrics.csv`: one row per step. The values are numbers, so the format
//! needs no quoting and no CSV library.

use super::Point;

/// The header row.
pub(super) const HEADER: &str = "step,loss,eval_loss,learning_rate,tokens_per_s,ms_per_step,comm_ms,comm_wait_ms,peak_mib,active_mib,grad_norm";

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| x.to_string())
}

/// The CSV text of `points` (empty cells where a step has no value).
pub(super) fn to_csv(points: &[Point]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for p in points {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            p.step,
            p.loss,
            opt(p.eval_loss),
            p.learning_rate,
            p.tokens_per_s,
            p.ms_per_step,
            p.comm_ms,
            p.comm_wait_ms,
            p.peak_mib,
            p.active_mib,
            opt(p.grad_norm)
        ));
    }
    out
}
