//! The workspace's code as macOS compiles it, checked on any host: clippy
//! with `-D warnings` for `aarch64-apple-darwin` (Apple silicon), so a
//! Linux-only call, or a macOS-only path that no longer compiles, fails the
//! suite on Linux CI too. It type-checks; nothing is linked or run.
//!
//! One dependency, `ring` (the QUIC backend's cryptography), compiles C in
//! its build script even for a check. Without Apple's SDK, clang gets
//! `-ffreestanding` (its own `stdint.h` and `stddef.h`) and three small
//! headers written here in place of the SDK's (`TargetConditionals.h` and
//! the few `string.h` and `assert.h` declarations ring's C uses). Their
//! objects are never linked, so only the declarations must be right.

use std::ffi::OsString;
use std::process::Command;

use anyhow::{Context, Result};

use crate::util::{cargo_with_env, target_dir};

/// The target checked: macOS on Apple silicon, what our users mostly run.
pub const TARGET: &str = "aarch64-apple-darwin";

/// Stand-ins for the SDK headers ring's C includes.
const HEADERS: &[(&str, &str)] = &[
    (
        "TargetConditionals.h",
        "#define TARGET_OS_MAC 1\n#define TARGET_OS_OSX 1\n\
         #define TARGET_OS_IPHONE 0\n#define TARGET_OS_IOS 0\n",
    ),
    (
        "string.h",
        "#include <stddef.h>\n\
         void *memcpy(void *, const void *, size_t);\n\
         void *memmove(void *, const void *, size_t);\n\
         void *memset(void *, int, size_t);\n\
         int memcmp(const void *, const void *, size_t);\n\
         size_t strlen(const char *);\n",
    ),
    (
        "assert.h",
        "#define assert(x) ((void)0)\n\
         #ifndef __cplusplus\n#define static_assert _Static_assert\n#endif\n",
    ),
];

/// Why the check cannot run here (the target's standard library is not
/// installed, or there is no clang), if it cannot.
pub fn unavailable() -> Option<String> {
    let libdir = Command::new("rustc")
        .args(["--print", "target-libdir", "--target", TARGET])
        .current_dir(crate::util::root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if !libdir.is_some_and(|d| std::path::Path::new(&d).is_dir()) {
        return Some(format!(
            "the {TARGET} standard library is not installed (rustup target add {TARGET})"
        ));
    }
    let clang = Command::new("clang").arg("--version").output();
    if !clang.is_ok_and(|o| o.status.success()) {
        return Some("clang is not installed (Debian: clang)".into());
    }
    None
}

/// Runs clippy for [`TARGET`] over the whole workspace, every target.
pub fn run() -> Result<()> {
    let include = target_dir().join("macos-check-include");
    std::fs::create_dir_all(&include)
        .with_context(|| format!("cannot create {}", include.display()))?;
    for (name, text) in HEADERS {
        std::fs::write(include.join(name), text)
            .with_context(|| format!("cannot write {}", include.join(name).display()))?;
    }
    let key = TARGET.replace('-', "_");
    let mut cflags = OsString::from("-ffreestanding -nostdlibinc -I");
    cflags.push(&include);
    let env: Vec<(String, OsString)> = vec![
        (format!("CC_{key}"), "clang".into()),
        (format!("CFLAGS_{key}"), cflags),
    ];
    let env: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    cargo_with_env(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--target",
            TARGET,
            "--",
            "-D",
            "warnings",
        ],
        &env,
    )
}
