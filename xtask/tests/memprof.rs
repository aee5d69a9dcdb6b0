//! `cargo xtask memprof` end to end on a tiny model, with the debug binaries of
//! this target folder (`cargo test --workspace` builds `mlx-launch` and
//! `mlx-llama` there because their packages have integration tests).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of the xtask binary under test, which also holds the workspace's
/// other binaries of the same profile.
fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_xtask"))
        .parent()
        .expect("the binary has a folder")
        .to_path_buf();
    for bin in ["mlx-launch", "mlx-llama"] {
        let p = dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
        assert!(
            p.exists(),
            "{} is missing: this test runs the real launcher and trainer; build them first \
             with `cargo build -p mlx-dist -p mlx-llama --bins` (or run `cargo test --workspace`)",
            p.display()
        );
    }
    dir
}

#[test]
fn memprof_writes_csv_table_and_chart_for_every_process() {
    let bins = bin_dir();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join("memprof-e2e");
    let _ = std::fs::remove_dir_all(&out);
    let cache = tmp.join("mlx-data-cache");
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "memprof",
            "--worlds",
            "1,2",
            // Enough steps that every rank lives for several sampling
            // intervals (3 steps of this model take ~30 ms).
            "--steps",
            "30",
            "--per-rank-batch",
            "1",
        ])
        .args(["--interval-ms", "20", "--debug", "--bin-dir"])
        .arg(&bins)
        .arg("--out")
        .arg(&out)
        .args([
            "--",
            "--layers",
            "2",
            "--dims",
            "64",
            "--heads",
            "2",
            "--mlp-dims",
            "128",
        ])
        .args(["--block-size", "64", "--data", "offline", "--data-cache"])
        .arg(&cache)
        .output()
        .expect("run xtask");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "xtask memprof failed:\n{stderr}\n{stdout}"
    );

    // CSV: samples of the launcher and of every rank at each world size.
    let csv = std::fs::read_to_string(out.join("samples.csv")).expect("samples.csv");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("world,tick,t_s,unix_ms,process,pid,rss_bytes,cpu_ms")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    for (world, who) in [
        (1, "launcher"),
        (1, "rank0"),
        (2, "launcher"),
        (2, "rank0"),
        (2, "rank1"),
    ] {
        let n = rows
            .iter()
            .filter(|r| r[0] == world.to_string() && r[4] == who)
            .count();
        assert!(n >= 2, "world {world}: {n} samples of {who}\n{csv}");
    }
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        let rss: u64 = r[6].parse().expect("rss is a number");
        assert!(
            rss > 100_000 && rss < 16 << 30,
            "implausible RSS {rss} in {r:?}"
        );
    }
    assert!(
        rows.iter().all(|r| r[4] != "rank2"),
        "world 2 has only ranks 0 and 1"
    );

    // Markdown: a row per process and a total per world size, and the checks.
    let md = std::fs::read_to_string(out.join("memprof.md")).expect("memprof.md");
    for row in [
        "| 1 | launcher |",
        "| 1 | rank0 |",
        "| 2 | rank1 |",
        "| 2 | **total** |",
    ] {
        assert!(md.contains(row), "no {row:?} in\n{md}");
    }
    assert!(md.contains("## Checks"), "{md}");
    // The array peak from the ranks' memory logs is filled in for ranks.
    let rank_row = md.lines().find(|l| l.starts_with("| 2 | rank1 |")).unwrap();
    let cells: Vec<&str> = rank_row.split('|').map(str::trim).collect();
    let array_peak: f64 = cells[6].parse().expect("array peak in MiB");
    assert!(array_peak > 0.0, "{rank_row}");

    // PNG: a real image with a panel per world size.
    let png = std::fs::read(out.join("memprof.png")).expect("memprof.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        png.len() > 10_000,
        "suspiciously small PNG ({} bytes)",
        png.len()
    );
    let img = image::load_from_memory(&png)
        .expect("the PNG decodes")
        .to_rgb8();
    assert_eq!(img.dimensions(), (1200, 720));
    let white = img.pixels().filter(|p| p.0 == [255, 255, 255]).count();
    let total = img.pixels().count();
    assert!(
        white < total * 99 / 100 && white > total / 2,
        "{white} of {total} pixels are white: not a chart"
    );

    assert!(
        stdout.contains("memprof.png"),
        "prints where the chart is:\n{stdout}"
    );
}
