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
                ("MLX_LCE", "blas"),
                ("MLX_PROFILE", "0"),
                ("MLX_GPU_VEC_LOADS", "0"),
            ],
        );
        assert!(t.contains("CHILD OK"), "{t}");
        return;
    }
    use mlx_array::settings::{self, LossPath};
    first_eval().unwrap();
    assert!(!settings::overlap().unwrap());
    assert_eq!(settings::loss_path().unwrap(), LossPath::Blas);
    settings::set_overlap(true);
    settings::set_loss_path(LossPath::Fused);
    assert!(settings::overlap().unwrap());
    assert_eq!(settings::loss_path().unwrap(), LossPath::Fused);
    assert!(!settings::gpu_vec_loads());
    settings::set_gpu_vec_loads(true);
    assert!(settings::gpu_vec_loads());
    println!("CHILD OK");
}
