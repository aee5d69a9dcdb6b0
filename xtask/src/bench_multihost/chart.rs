//! `projection.png`: the projected scaling efficiency against hosts.

use std::path::Path;

use anyhow::{Context, Result};

use super::projection::Projections;

/// Scaling efficiency against hosts (log scale), per projected rate, with
/// no overlap (solid) and perfect overlap (dashed).
pub(super) fn projection_chart(path: &Path, p: &Projections, compute_s: f64) -> Result<()> {
    use plotters::prelude::*;

    crate::report_common::register_chart_font();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let root_area = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root_area.fill(&WHITE).map_err(|e| err(&e))?;
    let max_hosts = p
        .rates
        .iter()
        .flat_map(|r| r.curve.last())
        .map(|x| x.hosts)
        .max()
        .unwrap_or(64) as f64;
    let y_min = p
        .rates
        .iter()
        .flat_map(|r| &r.curve)
        .map(|x| x.eff_serial * 100.0)
        .fold(100.0f64, f64::min);
    let y_lo = ((y_min - 5.0) / 10.0).floor().max(0.0) * 10.0;
    let mut chart = ChartBuilder::on(&root_area)
        .caption(
            format!(
                "Projected scaling efficiency, reference Llama ({:.0} ms compute per step)",
                compute_s * 1e3
            ),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..max_hosts.log2(), y_lo..100.5f64)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("hosts (one rank each; log scale)")
        .y_desc("compute / step time, %")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(*x)))
        .x_labels(max_hosts.log2() as usize + 1)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    const COLORS: [(u8, u8, u8); 4] = [
        (31, 119, 180),
        (214, 39, 40),
        (44, 160, 44),
        (148, 103, 189),
    ];
    for (k, r) in p.rates.iter().enumerate() {
        let (cr, cg, cb) = COLORS[k % COLORS.len()];
        let color = RGBAColor(cr, cg, cb, 1.0);
        let serial: Vec<(f64, f64)> = r
            .curve
            .iter()
            .map(|x| ((x.hosts as f64).log2(), x.eff_serial * 100.0))
            .collect();
        let overlap: Vec<(f64, f64)> = r
            .curve
            .iter()
            .map(|x| ((x.hosts as f64).log2(), x.eff_overlap * 100.0))
            .collect();
        chart
            .draw_series(LineSeries::new(serial, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{}: no overlap", r.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(DashedLineSeries::new(overlap, 6, 4, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{}: perfect overlap", r.name))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                    + PathElement::new(vec![(13, 0), (20, 0)], color.stroke_width(2))
            });
        let marks: Vec<(f64, f64)> = r
            .rows
            .iter()
            .map(|(x, _)| ((x.hosts as f64).log2(), x.eff_serial * 100.0))
            .collect();
        chart
            .draw_series(
                marks
                    .into_iter()
                    .map(|pt| Circle::new(pt, 4, color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root_area
        .present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alpha_beta::Fit;
    use crate::bench_multihost::projection::project_all;
    use crate::bench_multihost::results::RateFits;

    #[test]
    fn the_chart_is_written() {
        let dir = std::env::temp_dir().join(format!("mlx-multihost-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fits = [RateFits {
            rate: "10gbit".into(),
            bits: 10_000_000_000,
            joint: Some(Fit {
                alpha: 50e-6,
                beta: 1e-9,
                rms_rel: 0.1,
                max_rel: 0.2,
                samples: 20,
            }),
            per_world: vec![],
        }];
        let p = project_all(
            &fits,
            &[
                ("10gbit".into(), 10_000_000_000),
                ("100gbit".into(), 100_000_000_000),
            ],
            &[8, 16, 64],
            113_421_312,
            1.23,
        )
        .unwrap();
        let png = dir.join("projection.png");
        projection_chart(&png, &p, 1.23).unwrap();
        let img = image::open(&png).unwrap();
        assert_eq!((img.width(), img.height()), (1000, 600));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
