//! The generated suite: one named test per primitive and device for its
//! values, and one per primitive and device for its gradient, run by
//! `libtest-mimic` so `cargo test -- exp::gpu` runs a single one.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};

use super::{Ctx, Spec};
use crate::Device;

/// GPU checks run one at a time: they share one queue and one buffer pool,
/// and some read the memory counters.
static GPU: Mutex<()> = Mutex::new(());

/// Runs `specs` as a test binary (`harness = false`): a value test
/// `<name>::<device>` and a gradient test `<name>::grad::<device>` for each
/// specification and device, plus `every_primitive_has_a_spec`, which fails
/// when a type under one of `sources` implements `Primitive` without a
/// specification. Without a GPU adapter the GPU tests are ignored with the
/// reason printed, unless `CI` or `MLX_REQUIRE_GPU` is set: there they fail.
pub fn main(specs: Vec<Spec>, sources: &[&str]) -> ! {
    let args = Arguments::from_args();
    let gpu = gpu_state();
    if let GpuState::Absent(why) = &gpu {
        eprintln!("conformance: GPU tests ignored: {why}");
    }
    let mut trials = vec![completeness_trial(&specs, sources)];
    for spec in specs {
        let spec = Arc::new(spec);
        for &device in &spec.devices {
            trials.push(trial(&spec, device, false, &gpu));
            trials.push(trial(&spec, device, true, &gpu));
        }
    }
    libtest_mimic::run(&args, trials).exit()
}

/// Whether GPU tests run here, and why not.
#[derive(Clone)]
enum GpuState {
    Present,
    Absent(String),
    Required(String),
}

fn gpu_state() -> GpuState {
    match crate::device::gpu_available() {
        Ok(()) => GpuState::Present,
        Err(e) => {
            let why = e.to_string();
            if super::gpu_required() {
                GpuState::Required(format!(
                    "a GPU is required here (CI or MLX_REQUIRE_GPU is set): {why}"
                ))
            } else {
                GpuState::Absent(why)
            }
        }
    }
}

fn trial(spec: &Arc<Spec>, device: Device, gradient: bool, gpu: &GpuState) -> Trial {
    let name = if gradient {
        format!("{}::grad::{device}", spec.name)
    } else {
        format!("{}::{device}", spec.name)
    };
    let spec = spec.clone();
    let gpu = gpu.clone();
    let ignored = device == Device::Gpu && matches!(gpu, GpuState::Absent(_));
    Trial::test(name, move || {
        let _serial = match (device, &gpu) {
            (Device::Gpu, GpuState::Required(why)) => return Err(Failed::from(why)),
            (Device::Gpu, _) => Some(GPU.lock().unwrap_or_else(|e| e.into_inner())),
            (Device::Cpu, _) => None,
        };
        let run = || {
            if gradient {
                let case = crate::device::with_device(Device::Cpu, || (spec.gradient)());
                case.check(spec.name, device);
            } else {
                (spec.values)(&Ctx::new(device));
            }
        };
        catch_unwind(AssertUnwindSafe(run)).map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            Failed::from(msg.unwrap_or_else(|| "panicked".to_string()))
        })
    })
    .with_ignored_flag(ignored)
}

fn completeness_trial(specs: &[Spec], sources: &[&str]) -> Trial {
    let covered: BTreeSet<String> = specs.iter().map(|s| short_type(s.type_name)).collect();
    let sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
    Trial::test("every_primitive_has_a_spec", move || {
        let mut missing = vec![];
        for root in &sources {
            for (file, ty) in primitive_types(Path::new(root))? {
                if !covered.contains(&ty) {
                    missing.push(format!("{ty} ({file})"));
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "primitives without a conformance spec (add one next to the primitive): {}",
                missing.join(", ")
            )
            .into())
        }
    })
}

/// `a::b::Name<T>` → `Name`.
fn short_type(type_name: &str) -> String {
    let base = type_name.split('<').next().unwrap_or(type_name);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

/// Every `(file, Type)` with an `impl … Primitive for Type` under `root`.
fn primitive_types(root: &Path) -> Result<Vec<(String, String)>, Failed> {
    let mut found = vec![];
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                for line in text.lines() {
                    let line = line.trim_start();
                    if !line.starts_with("impl") {
                        continue;
                    }
                    let Some((_, rest)) = line.split_once("Primitive for ") else {
                        continue;
                    };
                    let ty: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    found.push((path.display().to_string(), ty));
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitive_impls_are_found_whatever_the_path_to_the_trait() {
        let dir = tempfile_dir();
        std::fs::write(
            dir.join("a.rs"),
            "impl Primitive for Foo {\n}\nimpl crate::Primitive for Bar<T> {}\n\
             // impl Primitive for Commented\nimpl mlx_array::Primitive for Baz {}\n",
        )
        .unwrap();
        let mut tys: Vec<String> = primitive_types(&dir)
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        tys.sort();
        assert_eq!(tys, ["Bar", "Baz", "Foo"]);
        assert_eq!(short_type("mlx_array::x::Bar<f32>"), "Bar");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mlx-conformance-scan-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
