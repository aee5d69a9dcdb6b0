//! The CPU backend's tuning: one value, [`CpuTuning`], read from
//! `MLX_CPU_TUNING` (`key=value,...`) or set in code. Each field chooses
//! between a fast path and the plain one it replaces, to compare the two
//! in one build.

use super::value::{Key, name_of, on_off, one_of, show_switch};

/// The CPU path of the one-pass output projection and loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossPath {
    /// The fused AVX-512 kernel where the CPU has it, else BLAS.
    Fused,
    /// Always BLAS (to compare the two in one build).
    Blas,
}

const LOSS_PATHS: [(LossPath, &str); 2] = [(LossPath::Fused, "fused"), (LossPath::Blas, "blas")];

/// The CPU backend's tuning (`MLX_CPU_TUNING`; [`super::cpu_tuning`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTuning {
    /// The one-pass output projection and loss's path.
    pub loss: LossPath,
    /// bfloat16 products (matmul, the one-pass output projection and loss)
    /// on AVX512_BF16 or AMX where the CPU has them (on), or converted to
    /// f32 for the BLAS and the f32 kernels.
    pub bf16: bool,
    /// Those bfloat16 products on AMX tiles where the CPU and the
    /// operating system offer them (on), or on AVX512_BF16 alone. Read
    /// once, at the first bfloat16 product.
    pub amx: bool,
}

impl Default for CpuTuning {
    fn default() -> CpuTuning {
        CpuTuning {
            loss: LossPath::Fused,
            bf16: true,
            amx: true,
        }
    }
}

impl std::fmt::Display for CpuTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&super::value::show_list(&CPU_KEYS, self))
    }
}

/// The keys of `MLX_CPU_TUNING`, in the order it writes them.
pub const CPU_KEYS: [Key<CpuTuning>; 3] = [
    Key {
        name: "loss",
        values: "`fused`, `blas`",
        doc: "the one-pass output projection and loss on its own AVX-512 kernels where the CPU has them, or on the BLAS",
        read: |t, v| one_of(&LOSS_PATHS, v).map(|x| t.loss = x),
        show: |t| name_of(&LOSS_PATHS, &t.loss),
    },
    Key {
        name: "bf16",
        values: "`on`, `off`",
        doc: "bfloat16 products (matmul, the one-pass output projection and loss, and on AMX the fused attention) on AMX or AVX512_BF16 where the CPU has them, or converted to f32 for the BLAS and the f32 kernels",
        read: |t, v| on_off(v).map(|x| t.bf16 = x),
        show: |t| show_switch(t.bf16),
    },
    Key {
        name: "amx",
        values: "`on`, `off`",
        doc: "those bfloat16 products on AMX tiles where the CPU and the operating system offer them, or on AVX512_BF16 alone (read at the first bfloat16 product)",
        read: |t, v| on_off(v).map(|x| t.amx = x),
        show: |t| show_switch(t.amx),
    },
];

#[cfg(test)]
mod tests {
    use super::super::value::read_list;
    use super::*;

    #[test]
    fn every_key_reads_back_what_it_writes() {
        let other = CpuTuning {
            loss: LossPath::Blas,
            bf16: false,
            amx: false,
        };
        for t in [CpuTuning::default(), other] {
            assert_eq!(read_list(&CPU_KEYS, Some(&t.to_string())).unwrap(), t);
        }
        for key in &CPU_KEYS {
            assert_ne!(
                key.show(&other),
                key.show(&CpuTuning::default()),
                "{}",
                key.name
            );
        }
        let t = read_list(&CPU_KEYS, Some("loss=BLAS")).unwrap();
        assert_eq!(t.loss, LossPath::Blas);
        let e = read_list(&CPU_KEYS, Some("loss=gpu")).unwrap_err();
        assert!(e.starts_with("loss") && e.contains("gpu"), "{e}");
    }
}
