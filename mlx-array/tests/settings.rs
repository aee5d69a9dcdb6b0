//! Environment settings: a value that is not understood fails the first
//! eval with an error naming the variable. The environment is read once per
//! process, so each case runs in a child process (this test binary again).

use std::process::Command;

use mlx_array::{Array, Dtype, eval};

const CHILD: &str = "MLX_SETTINGS_TEST_CHILD";

/// Runs `test` of this binary again with `vars` set; returns its output.
fn child(test: &str, vars: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    text
}

fn first_eval() -> Result<(), mlx_array::Error> {
    let x = Array::ones(&[4], Dtype::F32).add(&Array::ones(&[4], Dtype::F32))?;
    eval(&x)
}

#[test]
fn a_bad_value_fails_the_first_eval_naming_the_variable() {
    if std::env::var_os(CHILD).is_none() {
        let t = child(
            "a_bad_value_fails_the_first_eval_naming_the_variable",
            &[("MLX_OVERLAP", "sometimes")],
        );
        assert!(t.contains("CHILD SAW MLX_OVERLAP"), "{t}");
        return;
    }
    let e = first_eval().unwrap_err().to_string();
    assert!(e.contains("MLX_OVERLAP") && e.contains("sometimes"), "{e}");
    assert!(mlx_array::settings::check().is_err());
    println!("CHILD SAW MLX_OVERLAP");
}

#[test]
fn good_values_and_setters_work() {
    if std::env::var_os(CHILD).is_none() {
        let t = child(
            "good_values_and_setters_work",
            &[
                ("MLX_OVERLAP", "off"),
                ("MLX_CPU_TUNING", "loss=blas"),
                ("MLX_PROFILE", "0"),
                ("MLX_GPU_TUNING", "split_wave=64, coop_tile=256x128"),
            ],
        );
        assert!(t.contains("CHILD OK"), "{t}");
        return;
    }
    use mlx_array::settings::{self, GpuCoopTile, GpuTuning, LossPath};
    first_eval().unwrap();
    assert!(!settings::overlap().unwrap());
    assert_eq!(settings::cpu_tuning().loss, LossPath::Blas);
    let gpu = settings::gpu_tuning();
    assert_eq!((gpu.split_wave, gpu.coop_tile), (64, GpuCoopTile::Tall));
    // The keys not named keep their defaults.
    let mut want = GpuTuning::default();
    (want.split_wave, want.coop_tile) = (64, GpuCoopTile::Tall);
    assert_eq!(gpu, want);
    settings::set_overlap(true);
    settings::tune_cpu(|t| t.loss = LossPath::Fused);
    assert!(settings::overlap().unwrap());
    assert_eq!(settings::cpu_tuning().loss, LossPath::Fused);
    settings::set_gpu_tuning(Some(GpuTuning::default()));
    assert_eq!(settings::gpu_tuning(), GpuTuning::default());
    // Unset in code: the environment's again.
    settings::set_gpu_tuning(None);
    assert_eq!(settings::gpu_tuning(), want);
    println!("CHILD OK");
}

#[test]
fn a_bad_tuning_key_fails_the_first_eval_naming_the_variable_and_the_key() {
    if std::env::var_os(CHILD).is_none() {
        let t = child(
            "a_bad_tuning_key_fails_the_first_eval_naming_the_variable_and_the_key",
            &[("MLX_GPU_TUNING", "coop_tile=256x128,split_waves=4")],
        );
        assert!(t.contains("CHILD SAW THE KEY"), "{t}");
        return;
    }
    let e = first_eval().unwrap_err().to_string();
    assert!(e.contains("MLX_GPU_TUNING"), "{e}");
    assert!(e.contains("`split_waves` is not a key"), "{e}");
    assert!(
        e.contains("checked, chunks, split_wave)"),
        "the keys are listed: {e}"
    );
    println!("CHILD SAW THE KEY");
}

/// The repository's root (this crate's parent).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `docs/settings.md` shows the declared settings exactly as
/// [`mlx_array::settings::markdown`] writes them.
#[test]
fn the_settings_guide_shows_the_declared_table() {
    let path = repo().join("docs/settings.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let table = mlx_array::settings::markdown();
    assert!(
        text.contains(&table),
        "{} does not hold the declared settings; put this in its place:\n\n{table}",
        path.display()
    );
}

/// Every `MLX_CPU_*` or `MLX_GPU_*` name in the repository's code,
/// scripts and documents is a declared variable: a retired switch left in
/// a command or a doc would be ignored without a word.
#[test]
fn no_file_names_an_undeclared_backend_variable() {
    let declared: Vec<&str> = mlx_array::settings::VARIABLES
        .iter()
        .map(|v| v.name)
        .collect();
    let mut stale = Vec::new();
    let mut dirs = vec![repo()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    dirs.push(path);
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            for (i, line) in text.lines().enumerate() {
                for (at, _) in line.match_indices("MLX_") {
                    let token: String = line[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    let backend = ["MLX_GPU_", "MLX_CPU_"]
                        .iter()
                        .any(|p| token.len() > p.len() && token.starts_with(p));
                    if backend && !declared.contains(&token.as_str()) {
                        stale.push(format!("{}:{}: {token}", path.display(), i + 1));
                    }
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "undeclared variables:\n{}",
        stale.join("\n")
    );
}
