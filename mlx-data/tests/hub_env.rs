//! `HubConfig::from_env` reads the same variables as Python's huggingface_hub.
//! The only test in its binary, so changing the environment races with nothing.

use mlx_data::HubConfig;

#[test]
fn hub_settings_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "hf_secret\n").unwrap();
    // SAFETY: single-threaded: this binary has no other test.
    unsafe {
        std::env::remove_var("HF_HUB_CACHE");
        std::env::remove_var("HF_TOKEN");
        std::env::set_var("HF_HOME", dir.path());
        std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:1234/");
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    let c = HubConfig::from_env();
    assert_eq!(c.cache_dir, dir.path().join("hub"));
    assert_eq!(c.endpoint, "http://127.0.0.1:1234");
    assert!(c.offline);
    assert_eq!(c.token.as_deref(), Some("hf_secret"));
    assert!(
        !format!("{c:?}").contains("hf_secret"),
        "token must not be logged"
    );

    unsafe {
        std::env::set_var("HF_HUB_OFFLINE", "0");
        std::env::set_var("HF_HUB_CACHE", dir.path().join("elsewhere"));
        std::env::remove_var("HF_ENDPOINT");
    }
    let c = HubConfig::from_env();
    assert!(!c.offline);
    assert_eq!(c.cache_dir, dir.path().join("elsewhere"));
    assert_eq!(c.endpoint, "https://huggingface.co");
}
