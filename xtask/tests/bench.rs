//! `cargo xtask bench train` end to end on a tiny model, with the debug binaries
//! of this target folder (`cargo test --workspace` builds them).

use std::path::{Path, PathBuf};
use std::process::Command;

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
fn bench_train_reports_both_world_sizes_and_efficiency() {
    let bins = bin_dir();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join("bench-train-e2e");
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench", "train", "--steps", "3", "--debug", "--bin-dir"])
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
        .arg(tmp.join("mlx-data-cache"))
        .output()
        .expect("run xtask");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "xtask bench train failed:\n{stderr}\n{stdout}"
    );

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for (r, world) in runs.iter().zip([1, 2]) {
        assert_eq!(r["world"], world);
        for k in [
            "median_ms",
            "tokens_per_s",
            "peak_mib",
            "scaling_efficiency",
        ] {
            let x = r[k].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite() && x > 0.0, "world {world}: {k} = {x}");
        }
    }
    assert_eq!(runs[0]["scaling_efficiency"], 1.0);
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(
        md.contains("| 2 |") && md.contains("scaling efficiency"),
        "{md}"
    );
    assert!(stdout.contains("tokens/s"), "prints the table:\n{stdout}");
}

/// `xtask --version` answers, and `--help` opens with what it does.
#[test]
fn version_and_help_answer() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("xtask {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Developer and experiment tasks"));
}
