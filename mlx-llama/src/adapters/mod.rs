//! Low-rank adapters on a Llama: which projections of which blocks get a
//! LoRA or DoRA adapter ([`AdapterSpec`]), and the files people exchange
//! them in: PEFT's (`adapter_model.safetensors`, `adapter_config.json`) and
//! mlx-lm's (`adapters.safetensors`, `adapter_config.json`).
//!
//! The adapters themselves are [`mlx_nn::LoRALinear`] and
//! [`mlx_nn::DoRALinear`]; [`crate::Llama::add_adapters`] puts them in.

mod apply;
pub mod files;
pub mod mlx_lm;
mod options;
pub mod peft;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use apply::{
    ADAPTER_LEAVES, MLX_LM_DIR, apply_from, base_source, is_adapter_folder, is_adapter_tensor,
    write_both_layouts,
};
pub use files::{Layout, Rows, SaveOptions, load, load_rows, save};
pub use options::{AdapterOptions, FineTune, Targets};

/// LoRA or DoRA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AdapterKind {
    /// LoRA: `W + scale B A`.
    Lora,
    /// DoRA: LoRA with a trainable magnitude per output row.
    Dora,
}

/// A projection of a block that can carry an adapter, by the short names
/// people give them (PEFT's `target_modules` without `_proj`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The query projection (`self_attn.q_proj`; ours `attention.query_proj`).
    Q,
    /// The key projection (`self_attn.k_proj`; ours `attention.key_proj`).
    K,
    /// The value projection (`self_attn.v_proj`; ours `attention.value_proj`).
    V,
    /// The attention's output projection (`self_attn.o_proj`; ours `attention.out_proj`).
    O,
    /// The MLP's gate (`mlp.gate_proj`; ours `linear1`).
    Gate,
    /// The MLP's up projection (`mlp.up_proj`; ours `linear2`).
    Up,
    /// The MLP's down projection (`mlp.down_proj`; ours `linear3`).
    Down,
}

impl Target {
    /// Every target, in the order of a block.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The projection's path inside one of our blocks (`layers.N.` + this).
    pub fn ours(self) -> &'static str {
        match self {
            Target::Q => "attention.query_proj",
            Target::K => "attention.key_proj",
            Target::V => "attention.value_proj",
            Target::O => "attention.out_proj",
            Target::Gate => "linear1",
            Target::Up => "linear2",
            Target::Down => "linear3",
        }
    }

    /// The projection's path inside a Hugging Face (and mlx-lm) Llama
    /// block (`model.layers.N.` + this).
    pub fn hf(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// The short name: `q`, `k`, `v`, `o`, `gate`, `up` or `down`.
    pub fn short(self) -> &'static str {
        match self {
            Target::Q => "q",
            Target::K => "k",
            Target::V => "v",
            Target::O => "o",
            Target::Gate => "gate",
            Target::Up => "up",
            Target::Down => "down",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

impl FromStr for Target {
    type Err = String;
    /// A short name (`q`), or the Hugging Face module's (`q_proj`).
    fn from_str(s: &str) -> Result<Target, String> {
        let short = s.strip_suffix("_proj").unwrap_or(s);
        Target::ALL
            .into_iter()
            .find(|t| t.short() == short)
            .ok_or_else(|| format!("`{s}` is not a projection: one of q, k, v, o, gate, up, down"))
    }
}

/// Which projections of which blocks get an adapter, and its shape: what a
/// run's `--fine-tune lora|dora` with `--lora-*` builds, and what an adapter
/// file's configuration says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdapterSpec {
    /// LoRA or DoRA.
    pub kind: AdapterKind,
    /// The rank `r`.
    pub rank: usize,
    /// `alpha`: the update is scaled by `alpha / rank` (PEFT's
    /// `lora_alpha`; mlx-lm's `scale` is `alpha / rank`).
    pub alpha: f64,
    /// Dropout probability on the adapters' input while training.
    pub dropout: f64,
    /// The blocks that get adapters, in increasing order (mlx-lm's
    /// `--num-layers N` is the last N).
    pub layers: Vec<usize>,
    /// The projections that get adapters in each of those blocks.
    pub targets: Vec<Target>,
}

impl AdapterSpec {
    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The adapter's configuration for `mlx_nn`'s layers.
    pub fn lora_config(&self) -> mlx_nn::LoRAConfig {
        mlx_nn::LoRAConfig::default()
            .rank(self.rank)
            .alpha(self.alpha)
            .dropout(self.dropout)
    }

    /// The last `n` of `num_layers` blocks (all of them when `n` is 0 or
    /// at least `num_layers`).
    pub fn last_layers(n: usize, num_layers: usize) -> Vec<usize> {
        let n = if n == 0 {
            num_layers
        } else {
            n.min(num_layers)
        };
        (num_layers - n..num_layers).collect()
    }

    /// Checks the spec against a model of `num_layers` blocks.
    pub fn check(&self, num_layers: usize) -> Result<(), String> {
        if self.rank == 0 {
            return Err("the adapters' rank must be at least 1".into());
        }
        if !self.alpha.is_finite() {
            return Err(format!("alpha must be finite, got {}", self.alpha));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "the adapters' dropout must be in [0, 1), got {}",
                self.dropout
            ));
        }
        if self.targets.is_empty() {
            return Err("the adapters need at least one target projection".into());
        }
        if let Some(l) = self.layers.iter().find(|&&l| l >= num_layers) {
            return Err(format!(
                "block {l} cannot get an adapter: the model has {num_layers} blocks"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_by_either_name() {
        assert_eq!("q".parse::<Target>(), Ok(Target::Q));
        assert_eq!("gate_proj".parse::<Target>(), Ok(Target::Gate));
        assert!("qkv".parse::<Target>().unwrap_err().contains("`qkv`"));
        assert_eq!(AdapterSpec::last_layers(2, 5), vec![3, 4]);
        assert_eq!(AdapterSpec::last_layers(0, 3), vec![0, 1, 2]);
        assert_eq!(AdapterSpec::last_layers(16, 2), vec![0, 1]);
    }
}
