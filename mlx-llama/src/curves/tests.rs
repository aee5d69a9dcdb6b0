use super::*;

fn jsonl(lines: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    (dir, path)
}

const RUN: &[&str] = &[
    r#"{"step":1,"loss":10.5,"learning_rate":0.0003,"tokens_per_s":1000.0,"ms_per_step":2048.0,"comm_wait_ms":1.0,"comm_ms":2.0,"peak_mib":300.0,"active_mib":200.0}"#,
    r#"{"step":2,"loss":9.0,"learning_rate":0.0003,"tokens_per_s":2000.0,"ms_per_step":1024.0,"comm_wait_ms":1.0,"comm_ms":2.0,"peak_mib":300.0,"active_mib":200.0,"eval_loss":9.25}"#,
    "",
    // The run was resumed from step 1's checkpoint: step 2 again, then 3.
    r#"{"step":2,"loss":8.75,"learning_rate":0.0003,"tokens_per_s":2048.0,"ms_per_step":1000.0,"comm_wait_ms":0.5,"comm_ms":1.5,"peak_mib":310.0,"active_mib":210.0,"val_loss":9.5}"#,
    r#"{"step":3,"unix_time":1800000000.5,"epoch":0.75,"loss":8.0,"learning_rate":0.0001,"tokens_per_s":2100.0,"ms_per_step":975.0,"eval_ms":250.0,"comm_wait_ms":0.5,"comm_ms":1.5,"peak_mib":310.0,"active_mib":210.0,"grad_norm":1.5,"loss_scale":1024.0}"#,
];

#[test]
fn a_repeated_step_keeps_its_last_record_and_old_val_loss_reads_as_eval_loss() {
    let (_d, path) = jsonl(RUN);
    let points = read(&path).unwrap();
    assert_eq!(points.iter().map(|p| p.step).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(points[1].loss, 8.75);
    assert_eq!(points[1].eval_loss, Some(9.5));
    assert_eq!(points[0].eval_loss, None);
    assert_eq!(points[2].grad_norm, Some(1.5));
}

#[test]
fn a_broken_line_is_named() {
    let (_d, path) = jsonl(&[RUN[0], "{\"step\": 2, \"loss\": "]);
    let e = format!("{:#}", read(&path).unwrap_err());
    assert!(e.contains("metrics.jsonl line 2"), "{e}");
}

#[test]
fn the_csv_has_a_row_per_step_and_empty_cells_for_missing_values() {
    let (_d, path) = jsonl(RUN);
    let text = csv::to_csv(&read(&path).unwrap());
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows[0], csv::HEADER);
    // A record of before epoch and unix_time leaves their cells empty.
    assert_eq!(rows[1], "1,,,10.5,,0.0003,1000,2048,,2,1,300,200,,");
    assert_eq!(rows[2], "2,,,8.75,9.5,0.0003,2048,1000,,1.5,0.5,310,210,,");
    assert_eq!(
        rows[3],
        "3,0.75,1800000000.5,8,,0.0001,2100,975,250,1.5,0.5,310,210,1.5,1024"
    );
    assert_eq!(rows.len(), 4);
}

/// Pixels of exactly `colour` in rows `rows` of an RGB picture.
fn count(rgb: &[u8], width: u32, rows: Range<u32>, colour: RGBColor) -> usize {
    let row_bytes = width as usize * 3;
    rgb[rows.start as usize * row_bytes..rows.end as usize * row_bytes]
        .chunks(3)
        .filter(|p| p == &[colour.0, colour.1, colour.2])
        .count()
}

use plotters::style::RGBColor;
use std::ops::Range;

#[test]
fn the_picture_draws_the_training_loss_above_and_the_eval_loss_only_when_there_is_one() {
    let (_d, path) = jsonl(RUN);
    let points = read(&path).unwrap();
    let (rgb, (w, h)) = render_rgb(&points, "run").unwrap();
    let top = 0..plot::LOSS_ROWS;
    assert!(count(&rgb, w, top.clone(), TRAIN_COLOUR) > 100);
    assert!(count(&rgb, w, top.clone(), EVAL_COLOUR) > 20);
    // The lower panels have the throughput and the learning rate, not the losses.
    assert_eq!(count(&rgb, w, plot::LOSS_ROWS..h, TRAIN_COLOUR), 0);
    let lr_rows = plot::LOSS_ROWS + plot::SPEED_ROWS..h;
    assert!(count(&rgb, w, lr_rows.clone(), LR_COLOUR) > 100);
    assert_eq!(count(&rgb, w, 0..lr_rows.start, LR_COLOUR), 0);

    let without: Vec<Point> = points
        .into_iter()
        .map(|p| Point {
            eval_loss: None,
            ..p
        })
        .collect();
    let (rgb, _) = render_rgb(&without, "run").unwrap();
    assert_eq!(count(&rgb, w, 0..h, EVAL_COLOUR), 0);
    assert!(count(&rgb, w, top, TRAIN_COLOUR) > 100);
}

#[test]
fn write_puts_a_csv_and_a_png_beside_the_metrics() {
    let (dir, _) = jsonl(RUN);
    let w = write(dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&w.csv).unwrap().lines().count(), 4);
    let png = std::fs::read(&w.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // IHDR: width and height, big-endian, at bytes 16..24.
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), SIZE);
}

#[test]
fn a_single_step_still_draws() {
    let (_d, path) = jsonl(&RUN[..1]);
    let (rgb, _) = render_rgb(&read(&path).unwrap(), "one").unwrap();
    assert!(rgb.iter().any(|&b| b != 255));
}

/// Records at the ends of f64's range (a metrics file is read, not trusted):
/// before, an axis of -1e308..1e308 made the drawing rasterise lines for
/// minutes, and a negative throughput overflowed plotters' arithmetic.
#[test]
fn records_at_the_ends_of_the_range_still_draw_promptly() {
    let (_d, path) = jsonl(&[
        r#"{"step":1,"loss":1e308,"learning_rate":-1e308,"tokens_per_s":-1e300,"ms_per_step":1.0,"comm_wait_ms":0.0,"comm_ms":0.0,"peak_mib":1e308,"active_mib":0.0,"eval_loss":-1e308}"#,
        r#"{"step":18446744073709551615,"loss":-1e308,"learning_rate":1e308,"tokens_per_s":1e308,"ms_per_step":-1.0,"comm_wait_ms":0.0,"comm_ms":0.0,"peak_mib":0.0,"active_mib":0.0}"#,
    ]);
    let points = read(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(render_rgb(&points, "extremes").map(|r| r.1)));
    let drawn = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("drawn within a minute")
        .expect("drawn");
    assert_eq!(drawn, SIZE);
}

/// The mean row of `colour`'s pixels in each column of `rows` that has any.
fn line_rows(rgb: &[u8], width: u32, rows: Range<u32>, colour: RGBColor) -> Vec<(u32, f64)> {
    (0..width)
        .filter_map(|x| {
            let ys: Vec<u32> = rows
                .clone()
                .filter(|y| {
                    let i = ((y * width + x) * 3) as usize;
                    rgb[i..i + 3] == [colour.0, colour.1, colour.2]
                })
                .collect();
            (!ys.is_empty()).then(|| (x, ys.iter().sum::<u32>() as f64 / ys.len() as f64))
        })
        .collect()
}

#[test]
fn the_learning_rate_panel_draws_each_schedule_as_its_rates() {
    use crate::{ScheduleKind, TrainConfig};
    let (w, h) = SIZE;
    let rows = plot::LOSS_ROWS + plot::SPEED_ROWS..h;
    for schedule in [
        ScheduleKind::Constant,
        ScheduleKind::Cosine,
        ScheduleKind::Linear,
        ScheduleKind::Wsd,
        ScheduleKind::WsdSqrt,
    ] {
        let cfg = TrainConfig {
            steps: 200,
            warmup: 20,
            learning_rate: 1e-3,
            schedule,
            ..TrainConfig::default()
        };
        let lr = crate::trainer::lr_schedule(&cfg).unwrap();
        let points: Vec<Point> = (1..=200)
            .map(|step| Point {
                step,
                loss: 1.0,
                learning_rate: lr.at(step - 1),
                tokens_per_s: 1000.0,
                ..Point::default()
            })
            .collect();
        let (rgb, _) = render_rgb(&points, "run").unwrap();
        let line = line_rows(&rgb, w, rows.clone(), LR_COLOUR);
        // The line spans the steps: its first and last columns are steps 1
        // and 200; each step's rate is then read off its column's height,
        // as a straight map from the highest rate (the stable part) to 0.
        let (x0, x1) = (line[0].0 as f64, line.last().unwrap().0 as f64);
        let y_at = |step: u64| {
            let x = (x0 + (step - 1) as f64 / 199.0 * (x1 - x0)).round() as u32;
            line.iter().find(|(c, _)| *c == x).unwrap().1
        };
        // Step 1's rate is 0 (warmup from 0), step 21's (t = 20, the end of
        // warmup) 1e-3: the map's two ends.
        let (y_peak, y_first) = (y_at(21), y_at(1));
        assert_eq!(lr.at(20), 1e-3);
        assert!(y_first > y_peak + 100.0, "{schedule:?}: {y_first} {y_peak}");
        let peak = 1e-3;
        for step in [11, 21, 60, 120, 165, 170, 180, 190, 200] {
            let want = y_first + (y_peak - y_first) * lr.at(step - 1) / peak;
            let got = y_at(step);
            assert!(
                (got - want).abs() <= 3.0,
                "{schedule:?} step {step}: rate {} drawn at row {got}, expected {want}",
                lr.at(step - 1)
            );
        }
    }
}
