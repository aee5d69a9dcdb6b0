//! `Display` for arrays, in MLX's style: `array([[1, 2], [3, 4]], dtype=int32)`.

use std::fmt;

use crate::{Array, Dtype};

const EDGE: usize = 3;
const SUMMARISE_ABOVE: usize = 1000;

fn fmt_value(v: f64, dtype: Dtype) -> String {
    match dtype {
        Dtype::Bool => (if v != 0.0 { "true" } else { "false" }).into(),
        d if d.is_integer() => format!("{}", v as i64),
        _ => {
            if v.is_finite() && v == v.trunc() && v.abs() < 1e16 {
                format!("{v}.")
            } else {
                format!("{v:.6}").trim_end_matches('0').to_string()
            }
        }
    }
}

fn write_nd(
    out: &mut String,
    vals: &[f64],
    shape: &[usize],
    dtype: Dtype,
    depth: usize,
    summarise: bool,
) {
    if shape.is_empty() {
        out.push_str(&fmt_value(vals[0], dtype));
        return;
    }
    let n = shape[0];
    let step = vals.len() / n.max(1);
    out.push('[');
    let mut i = 0;
    while i < n {
        if summarise && n > 2 * EDGE && i == EDGE {
            out.push_str("..., ");
            i = n - EDGE;
            continue;
        }
        if i > 0 {
            out.push(',');
            if shape.len() > 1 {
                out.push('\n');
                out.push_str(&" ".repeat(depth + 7));
            } else {
                out.push(' ');
            }
        }
        write_nd(
            out,
            &vals[i * step..(i + 1) * step],
            &shape[1..],
            dtype,
            depth + 1,
            summarise,
        );
        i += 1;
    }
    out.push(']');
}

impl fmt::Display for Array {
    /// Evaluates the array and prints its values; errors print in place of values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals: Vec<f64> = if self.dtype().is_integer() {
            self.to_vec::<i64>()
                .map(|v| v.into_iter().map(|x| x as f64).collect())
        } else {
            self.to_vec::<f32>()
                .map(|v| v.into_iter().map(f64::from).collect())
        }
        .map_err(|_| fmt::Error)?;
        let mut s = String::new();
        write_nd(
            &mut s,
            &vals,
            self.shape(),
            self.dtype(),
            0,
            self.size() > SUMMARISE_ABOVE,
        );
        write!(f, "array({s}, dtype={})", self.dtype())
    }
}
