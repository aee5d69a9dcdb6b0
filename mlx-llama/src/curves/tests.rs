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
    r#"{"step":3,"loss":8.0,"learning_rate":0.0001,"tokens_per_s":2100.0,"ms_per_step":975.0,"comm_wait_ms":0.5,"comm_ms":1.5,"peak_mib":310.0,"active_mib":210.0,"grad_norm":1.5}"#,
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
    assert_eq!(rows[1], "1,10.5,,0.0003,1000,2048,2,1,300,200,");
    assert_eq!(rows[2], "2,8.75,9.5,0.0003,2048,1000,1.5,0.5,310,210,");
    assert_eq!(rows[3], "3,8,,0.0001,2100,975,1.5,0.5,310,210,1.5");
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
    let top = 0..h * 3 / 5;
    assert!(count(&rgb, w, top.clone(), TRAIN_COLOUR) > 100);
    assert!(count(&rgb, w, top.clone(), EVAL_COLOUR) > 20);
    // The lower panel has the throughput, not the losses.
    assert_eq!(count(&rgb, w, h * 3 / 5..h, TRAIN_COLOUR), 0);

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
    assert_eq!((width, height), (1000, 700));
}

#[test]
fn a_single_step_still_draws() {
    let (_d, path) = jsonl(&RUN[..1]);
    let (rgb, _) = render_rgb(&read(&path).unwrap(), "one").unwrap();
    assert!(rgb.iter().any(|&b| b != 255));
}
