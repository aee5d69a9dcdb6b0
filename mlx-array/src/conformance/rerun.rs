//! Running one test of the current test binary again in a child process
//! with other environment variables: for settings read once per process
//! (the CPU tuning's `amx`, the GPU tuning's `f16`), whose other value cannot be tried in place.

use std::process::Command;

/// Runs the test named `name` (`--exact`) of this test binary in a child
/// with `env` set, asserts that it ran and passed, and returns its
/// standard error (the test's `eprintln!`s, with `--nocapture`).
pub fn rerun_with_env(name: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs again");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} with {env:?}:\n{stdout}\n{stderr}"
    );
    stderr
}

/// For a test that takes the AMX tiles where the CPU has them and prints
/// [`crate::backend::cpu::bf16_products`]: runs it (`name`) again in a
/// child with `MLX_CPU_TUNING=amx=off` and asserts that the child did not use AMX.
/// Does nothing in the child itself, or in a run whose `MLX_CPU_TUNING`
/// already chose `amx`.
pub fn rerun_without_amx(name: &str) {
    if std::env::var("MLX_CPU_TUNING").is_ok_and(|v| v.contains("amx")) {
        return;
    }
    let stderr = rerun_with_env(name, &[("MLX_CPU_TUNING", "amx=off")]);
    assert!(
        !stderr.contains("Amx"),
        "MLX_CPU_TUNING=amx=off still used AMX: {stderr}"
    );
}
