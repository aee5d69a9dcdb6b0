//! Whether GPU tests run here: the one rule every GPU test follows.

/// Whether a GPU is required (`CI` or `MLX_REQUIRE_GPU` is set): there a
/// GPU test without an adapter fails instead of skipping (CI installs
/// Mesa's lavapipe).
pub fn gpu_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("MLX_REQUIRE_GPU").is_some()
}

/// True when a GPU adapter is usable. Without one, prints why the test is
/// skipped and returns false, or panics when [`gpu_required`].
pub fn gpu_or_skip() -> bool {
    match crate::device::gpu_available() {
        Ok(()) => true,
        Err(e) => {
            assert!(
                !gpu_required(),
                "a GPU is required here (CI or MLX_REQUIRE_GPU is set): {e}"
            );
            eprintln!("skipping GPU test: {e}");
            false
        }
    }
}
