//! Every environment variable mlx-array reads, declared once in
//! [`VARIABLES`] (name, values, what it changes, its setter), with the keys
//! of its two tuning variables in [`CPU_KEYS`] and [`GPU_KEYS`]. Each has a
//! setter that wins over the environment, for programs that configure
//! themselves. A value that is not understood is an error naming the
//! variable: [`check`] reports it, and so does the first
//! [`eval`](fn@crate::eval) of the process, instead of silently using a
//! default. `docs/settings.md` shows [`markdown`]'s tables (a test keeps
//! them equal).
//!
//! Six variables: the device, the evaluator's overlap, the profile, the
//! BLAS library, and one tuning list per backend (`key=value,...`):
//! `MLX_GPU_TUNING=coop_tile=256x128,checked=off` is a measurement's
//! variant of one value, [`GpuTuning`], that each GPU entry point reads
//! once and hands to the planning below it.
//!
//! ```
//! use mlx_array::settings;
//! settings::set_overlap(false); // plain graph order
//! assert!(!settings::overlap()?);
//! settings::set_overlap(true);
//! settings::tune_gpu(|t| t.split_wave = 1); // never split products over their depth
//! assert_eq!(settings::gpu_tuning().split_wave, 1);
//! settings::set_gpu_tuning(None); // back to MLX_GPU_TUNING's
//! # Ok::<(), mlx_array::Error>(())
//! ```

mod cpu;
mod gpu;
mod value;

use std::sync::{Mutex, OnceLock};

pub use cpu::{CPU_KEYS, CpuTuning, LossPath};
pub use gpu::{
    GPU_ATTENTION_TILES, GPU_COOP_SUBGROUPS, GPU_KEYS, GpuChecks, GpuCoopTile, GpuCoopmat,
    GpuF32Tile, GpuTuning,
};
pub use value::Key;

use crate::error::{Error, Result};
use value::{Setting, read_list, switch};

/// `MLX_DEVICE`: the default device.
pub const MLX_DEVICE: &str = "MLX_DEVICE";
/// `MLX_OVERLAP`: the evaluator runs what waits for no collective first.
pub const MLX_OVERLAP: &str = "MLX_OVERLAP";
/// `MLX_PROFILE`: time every primitive (on the GPU, by timestamp queries).
pub const MLX_PROFILE: &str = "MLX_PROFILE";
/// `MLX_BLAS`: the CBLAS library for the matrix multiply.
pub const MLX_BLAS: &str = "MLX_BLAS";
/// `MLX_CPU_TUNING`: the CPU backend's tuning ([`CPU_KEYS`]).
pub const MLX_CPU_TUNING: &str = "MLX_CPU_TUNING";
/// `MLX_GPU_TUNING`: the GPU backend's tuning ([`GPU_KEYS`]).
pub const MLX_GPU_TUNING: &str = "MLX_GPU_TUNING";

/// One environment variable: its name, the values it takes (default
/// first), what it changes, and the setter that wins over it.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// The values it takes, the default first.
    pub values: &'static str,
    /// What it changes.
    pub doc: &'static str,
    /// The function that sets it in code.
    pub setter: &'static str,
}

/// Every environment variable mlx-array reads.
pub const VARIABLES: [Variable; 6] = [
    Variable {
        name: MLX_DEVICE,
        values: "`cpu`, `gpu`",
        doc: "the device new arrays are placed on",
        setter: "device::set_default_device",
    },
    Variable {
        name: MLX_OVERLAP,
        values: "`on`, `off`",
        doc: "the evaluator runs what waits for no collective first",
        setter: "settings::set_overlap",
    },
    Variable {
        name: MLX_PROFILE,
        values: "`off`, `on`",
        doc: "every primitive timed (`mlx_array::profile`), GPU ones by timestamp queries around their compute passes where the adapter has them (set it before the GPU's first use; each eval then waits for its GPU work)",
        setter: "settings::set_profile",
    },
    Variable {
        name: MLX_BLAS,
        values: "the system's (OpenBLAS; Accelerate on macOS), a CBLAS library's path or name, `none`",
        doc: "the CBLAS library the matrix multiply loads at its first use; `none`: the pure-Rust GEMM",
        setter: "settings::set_blas",
    },
    Variable {
        name: MLX_CPU_TUNING,
        values: "`key=value,...` of the keys below (each key's default when absent)",
        doc: "the CPU backend's fast paths, each against the plain one it replaces",
        setter: "settings::set_cpu_tuning",
    },
    Variable {
        name: MLX_GPU_TUNING,
        values: "`key=value,...` of the keys below (each key's default when absent)",
        doc: "the GPU backend's tuning: tiles, kernels and checks a measurement on a device may still change",
        setter: "settings::set_gpu_tuning",
    },
];

static OVERLAP: Setting<bool> = Setting::new(MLX_OVERLAP, |v| switch(v, true));
static PROFILE: Setting<bool> = Setting::new(MLX_PROFILE, |v| switch(v, false));
static CPU: Setting<CpuTuning> = Setting::new(MLX_CPU_TUNING, |v| read_list(&CPU_KEYS, v));
static GPU: Setting<GpuTuning> = Setting::new(MLX_GPU_TUNING, |v| read_list(&GPU_KEYS, v));

/// Whether the evaluator overlaps communication with computation (runs
/// what waits for no collective first). Default on.
pub fn overlap() -> Result<bool> {
    OVERLAP.checked()
}

/// Turns the evaluator's overlap of communication on or off (wins over `MLX_OVERLAP`).
pub fn set_overlap(on: bool) {
    OVERLAP.set(Some(on));
}

/// Whether every primitive is timed (see [`crate::profile`]). Default off.
pub fn profile() -> Result<bool> {
    PROFILE.checked()
}

/// Turns the per-primitive profile on or off (wins over `MLX_PROFILE`). GPU
/// execution times need it on before the GPU is first used.
pub fn set_profile(on: bool) {
    PROFILE.set(Some(on));
}

/// The CPU backend's tuning: what [`set_cpu_tuning`] set, else
/// `MLX_CPU_TUNING`'s. An unreadable `MLX_CPU_TUNING` counts as the
/// default here; [`check`] reports it.
pub fn cpu_tuning() -> CpuTuning {
    CPU.checked().unwrap_or_default()
}

/// Sets the CPU backend's tuning (wins over `MLX_CPU_TUNING`; `None`: back
/// to the environment's).
pub fn set_cpu_tuning(tuning: Option<CpuTuning>) {
    CPU.set(tuning);
}

/// Changes the CPU backend's tuning in place: `change` edits the current
/// value, which is then set as [`set_cpu_tuning`] does.
pub fn tune_cpu(change: impl FnOnce(&mut CpuTuning)) {
    let mut t = cpu_tuning();
    change(&mut t);
    set_cpu_tuning(Some(t));
}

/// The GPU backend's tuning: what [`set_gpu_tuning`] set, else
/// `MLX_GPU_TUNING`'s. An unreadable `MLX_GPU_TUNING` counts as the
/// default here; [`check`] reports it.
pub fn gpu_tuning() -> GpuTuning {
    GPU.checked().unwrap_or_default()
}

/// Sets the GPU backend's tuning (wins over `MLX_GPU_TUNING`; `None`: back
/// to the environment's). A GPU entry point reads it once per call, so a
/// change takes effect at the next one; `f16` only before the GPU's first
/// use.
pub fn set_gpu_tuning(tuning: Option<GpuTuning>) {
    GPU.set(tuning);
}

/// Changes the GPU backend's tuning in place: `change` edits the current
/// value, which is then set as [`set_gpu_tuning`] does.
pub fn tune_gpu(change: impl FnOnce(&mut GpuTuning)) {
    let mut t = gpu_tuning();
    change(&mut t);
    set_gpu_tuning(Some(t));
}

/// Which CBLAS library to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlasChoice {
    /// The system's (OpenBLAS and kin; Accelerate on macOS).
    System,
    /// None: the pure-Rust GEMM.
    None,
    /// This library (a path or a name the dynamic loader finds).
    Library(String),
}

static BLAS_SET: Mutex<Option<BlasChoice>> = Mutex::new(None);
static BLAS_READ: OnceLock<BlasChoice> = OnceLock::new();

/// The CBLAS library the matrix multiply loads (`MLX_BLAS`). Read once, at
/// the first matrix multiply; [`set_blas`] must come before it.
pub fn blas() -> BlasChoice {
    BLAS_READ
        .get_or_init(|| {
            if let Some(c) = BLAS_SET.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return c;
            }
            match std::env::var(MLX_BLAS) {
                Ok(v) if v.trim() == "none" => BlasChoice::None,
                Ok(v) if !v.trim().is_empty() => BlasChoice::Library(v.trim().to_string()),
                _ => BlasChoice::System,
            }
        })
        .clone()
}

/// Chooses the CBLAS library (wins over `MLX_BLAS`). An error once the
/// library was loaded: the process keeps the one it has.
pub fn set_blas(choice: BlasChoice) -> Result<()> {
    let mut s = BLAS_SET.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(current) = BLAS_READ.get() {
        if *current == choice {
            return Ok(());
        }
        return Err(Error::invalid(
            MLX_BLAS,
            format!(
                "the BLAS library was already chosen ({current:?}); set it before the first matrix multiply"
            ),
        ));
    }
    *s = Some(choice);
    Ok(())
}

/// Checks every variable above that this module reads, returning the first
/// one that is not understood. The settings are a leaf: what needs more
/// than parsing is checked where it is used (`MLX_DEVICE` by
/// [`crate::device::default_device_from_env`], whether an `MLX_BLAS`
/// library loads by the CPU backend); the first [`eval`](fn@crate::eval)
/// checks all of them.
pub fn check() -> Result<()> {
    overlap()?;
    profile()?;
    CPU.checked()?;
    GPU.checked()?;
    Ok(())
}

/// The settings as `docs/settings.md` shows them: the variables, then each
/// tuning variable's keys with their defaults.
pub fn markdown() -> String {
    let mut out = String::from(
        "| variable | values (default first) | what it changes | in code |\n|---|---|---|---|\n",
    );
    for v in VARIABLES {
        out += &format!(
            "| `{}` | {} | {} | `{}` |\n",
            v.name, v.values, v.doc, v.setter
        );
    }
    out += &keys_markdown(MLX_CPU_TUNING, &CPU_KEYS, &CpuTuning::default());
    out += &keys_markdown(MLX_GPU_TUNING, &GPU_KEYS, &GpuTuning::default());
    out
}

/// The table of one tuning variable's keys.
fn keys_markdown<T>(name: &str, keys: &[Key<T>], default: &T) -> String {
    let mut out = format!(
        "\nThe keys of `{name}`:\n\n| key | values | default | what it changes |\n|---|---|---|---|\n"
    );
    for k in keys {
        out += &format!(
            "| `{}` | {} | `{}` | {} |\n",
            k.name,
            k.values,
            k.show(default),
            k.doc
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_is_declared_once_and_documented() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len());
        assert!(VARIABLES.len() <= 8, "at most 8 variables");
        let md = markdown();
        for v in VARIABLES {
            assert!(md.contains(&format!("| `{}` |", v.name)), "{}", v.name);
        }
        for k in CPU_KEYS
            .iter()
            .map(|k| k.name)
            .chain(GPU_KEYS.iter().map(|k| k.name))
        {
            assert!(md.contains(&format!("| `{k}` |")), "{k}");
        }
    }
}
