//! `loss.png`: the training loss and the validation loss over the steps
//! above, tokens per second below them and the learning rate at the
//! bottom. The font is Hack from the
//! `epaint_default_fonts` crate (as xtask's charts use), so the picture does
//! not depend on the fonts a machine has.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::Point;

/// The training loss's colour.
pub const TRAIN_COLOUR: RGBColor = RGBColor(31, 119, 180);
/// The validation loss's colour.
pub const EVAL_COLOUR: RGBColor = RGBColor(214, 39, 40);
/// The throughput's colour.
const SPEED_COLOUR: RGBColor = RGBColor(44, 160, 44);
/// The learning rate's colour.
pub const LR_COLOUR: RGBColor = RGBColor(148, 103, 189);

/// Picture size in pixels.
pub const SIZE: (u32, u32) = (1000, 900);
/// The rows of the loss panel (from the top), then of the throughput's;
/// the learning rate's take the rest.
pub(super) const LOSS_ROWS: u32 = 480;
pub(super) const SPEED_ROWS: u32 = 210;

fn font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::HACK_REGULAR,
        )
        .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded Hack font could not be read"))
    }
}

/// The largest magnitude a panel's axis spans: the records are read from a
/// file, and values near `f64::MAX` overflow the axis's arithmetic.
const LIMIT: f64 = 1e100;

/// `lo..hi` widened by 5% (and to a unit span when flat), within ±[`LIMIT`].
fn padded(lo: f64, hi: f64) -> Range<f64> {
    if !(lo.is_finite() && hi.is_finite()) {
        return 0.0..1.0;
    }
    let (lo, hi) = (lo.clamp(-LIMIT, LIMIT), hi.clamp(-LIMIT, LIMIT));
    if hi - lo < 1e-9 {
        return lo - 0.5..hi + 0.5;
    }
    let pad = (hi - lo) * 0.05;
    lo - pad..hi + pad
}

/// `v` where the panel of y-range `r` draws it: at its edge when outside it
/// (a line to a point far outside is rasterised pixel by pixel, and one
/// near `f64::MAX` overflows the drawing's integers), at the bottom when NaN.
fn within(r: &Range<f64>, v: f64) -> f64 {
    if v.is_nan() {
        r.start
    } else {
        v.clamp(r.start, r.end)
    }
}

fn drawing<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the loss curve: {e:?}")
}

/// Draws the two panels on `area`.
fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    points: &[Point],
    title: &str,
) -> Result<()> {
    area.fill(&WHITE).map_err(drawing)?;
    let first = points.first().map_or(0, |p| p.step) as f64;
    let last = points.last().map_or(1, |p| p.step) as f64;
    let steps = if last > first {
        first..last
    } else {
        first..first + 1.0
    };
    let evals: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| p.eval_loss.map(|e| (p.step as f64, e)))
        .collect();
    let losses = points
        .iter()
        .map(|p| p.loss)
        .chain(evals.iter().map(|e| e.1))
        .filter(|l| l.is_finite());
    let (lo, hi) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    let loss_range = padded(lo, hi);
    let (top, rest) = area.split_vertically(LOSS_ROWS);
    let (bottom, lowest) = rest.split_vertically(SPEED_ROWS);
    let mut chart = ChartBuilder::on(&top)
        .caption(format!("{title} loss"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .build_cartesian_2d(steps.clone(), loss_range.clone())
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("loss")
        .draw()
        .map_err(drawing)?;
    chart
        .draw_series(LineSeries::new(
            points
                .iter()
                .map(|p| (p.step as f64, within(&loss_range, p.loss))),
            TRAIN_COLOUR.stroke_width(2),
        ))
        .map_err(drawing)?
        .label("train loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], TRAIN_COLOUR.stroke_width(2)));
    if !evals.is_empty() {
        chart
            .draw_series(LineSeries::new(
                evals.iter().map(|&(x, y)| (x, within(&loss_range, y))),
                EVAL_COLOUR.stroke_width(2),
            ))
            .map_err(drawing)?
            .label("eval_loss")
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], EVAL_COLOUR.stroke_width(2))
            });
        chart
            .draw_series(
                evals.iter().map(|&(x, y)| {
                    Circle::new((x, within(&loss_range, y)), 4, EVAL_COLOUR.filled())
                }),
            )
            .map_err(drawing)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(drawing)?;

    let speed_hi = points.iter().map(|p| p.tokens_per_s).fold(0.0, f64::max);
    let speed_range = 0.0..(speed_hi.min(LIMIT) * 1.1).max(1.0);
    let mut chart = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .build_cartesian_2d(steps.clone(), speed_range.clone())
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("tokens/s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(drawing)?;
    chart
        .draw_series(LineSeries::new(
            points
                .iter()
                .map(|p| (p.step as f64, within(&speed_range, p.tokens_per_s))),
            SPEED_COLOUR.stroke_width(2),
        ))
        .map_err(drawing)?;

    // The learning rate from 0, so that a schedule's shape reads at a glance.
    let lr_hi = points.iter().map(|p| p.learning_rate).fold(0.0, f64::max);
    let lr_top = if lr_hi > 0.0 {
        lr_hi.min(LIMIT) * 1.1
    } else {
        1.0
    };
    let lr_range = 0.0..lr_top;
    let mut chart = ChartBuilder::on(&lowest)
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .build_cartesian_2d(steps, lr_range.clone())
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("learning rate")
        .y_labels(4)
        .y_label_formatter(&|y| format!("{y:.1e}"))
        .draw()
        .map_err(drawing)?;
    chart
        .draw_series(LineSeries::new(
            points
                .iter()
                .map(|p| (p.step as f64, within(&lr_range, p.learning_rate))),
            LR_COLOUR.stroke_width(2),
        ))
        .map_err(drawing)?;
    area.present().map_err(drawing)
}

/// Writes the picture of `points` to `path` as a PNG.
pub(super) fn write_png(points: &[Point], title: &str, path: &Path) -> Result<()> {
    font()?;
    let area = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&area, points, title)
}

/// The same picture as RGB bytes (`width * height * 3`, row by row), with its size.
pub fn render_rgb(points: &[Point], title: &str) -> Result<(Vec<u8>, (u32, u32))> {
    font()?;
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let area = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        draw(&area, points, title)?;
    }
    Ok((buf, SIZE))
}
