//! `metrics.csv`: one row per step, with every figure of `metrics.jsonl`.
//! The values are numbers, so the format needs no quoting and no CSV
//! library.

use super::Point;

/// The header row.
pub(super) const HEADER: &str = "step,epoch,unix_time,loss,eval_loss,learning_rate,tokens_per_s,ms_per_step,eval_ms,comm_ms,comm_wait_ms,peak_mib,active_mib,grad_norm,loss_scale";

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| x.to_string())
}

/// The CSV text of `points` (empty cells where a step has no value).
pub(super) fn to_csv(points: &[Point]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    for p in points {
        let row = [
            p.step.to_string(),
            opt(p.epoch),
            opt(p.unix_time),
            p.loss.to_string(),
            opt(p.eval_loss),
            p.learning_rate.to_string(),
            p.tokens_per_s.to_string(),
            p.ms_per_step.to_string(),
            opt(p.eval_ms),
            p.comm_ms.to_string(),
            p.comm_wait_ms.to_string(),
            p.peak_mib.to_string(),
            p.active_mib.to_string(),
            opt(p.grad_norm),
            opt(p.loss_scale),
        ];
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}
