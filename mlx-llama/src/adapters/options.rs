//! `mlx-llama train`'s fine-tuning options: `--fine-tune lora|dora|full`
//! and the adapters' shape.

use serde::{Deserialize, Serialize};

use super::{AdapterKind, AdapterSpec, Target};
use crate::config::FloatDtype;

/// What a run trains of the model it starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FineTune {
    /// Every weight (today's training, and pretraining).
    #[default]
    Full,
    /// LoRA adapters on frozen weights.
    Lora,
    /// DoRA adapters on frozen weights.
    Dora,
}

/// Projections, as `--lora-targets` names them: comma-separated short
/// names (`q,v`); serialised as a list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Targets(pub Vec<Target>);

impl std::str::FromStr for Targets {
    type Err = String;
    fn from_str(s: &str) -> Result<Targets, String> {
        s.split(',')
            .map(|t| t.trim().parse())
            .collect::<Result<_, _>>()
            .map(Targets)
    }
}

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.short()).collect();
        f.write_str(&names.join(","))
    }
}

/// The fine-tuning options of a run (flattened into
/// [`TrainConfig`](crate::TrainConfig); the field docs are `--help`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct AdapterOptions {
    /// Fine-tuning: full (every weight trains), or lora / dora (low-rank
    /// adapters train on a frozen model, usually with --init-from; only
    /// the adapters are checkpointed, in PEFT's and mlx-lm's layouts).
    #[arg(long, value_enum, default_value_t)]
    pub fine_tune: FineTune,
    /// Fine-tuning: the adapters' rank (mlx-lm's and PEFT's default: 8).
    #[arg(long, default_value_t = 8)]
    pub lora_rank: usize,
    /// Fine-tuning: the adapters' alpha; their update is scaled by
    /// alpha / rank (PEFT's lora_alpha, default 8 there; mlx-lm gives the
    /// scale itself, 20, which is alpha 160 at rank 8).
    #[arg(long, default_value_t = 16.0)]
    pub lora_alpha: f64,
    /// Fine-tuning: dropout on the adapters' input while training.
    #[arg(long, default_value_t = 0.0)]
    pub lora_dropout: f64,
    /// Fine-tuning: adapt the last N blocks (mlx-lm's --num-layers, 16 by
    /// default there and here; 0: every block; PEFT adapts every block).
    #[arg(long, default_value_t = 16)]
    pub lora_layers: usize,
    /// Fine-tuning: the projections that get adapters, comma-separated, of
    /// q, k, v, o, gate, up, down (mlx-lm's default: all seven; PEFT's for
    /// Llama: q,v).
    #[arg(long, default_value = "q,k,v,o,gate,up,down")]
    pub lora_targets: Targets,
    /// Fine-tuning: the dtype the frozen base weights are held in (bf16 or
    /// f16 halve their memory); the adapters train in f32.
    #[arg(long, value_enum, default_value_t)]
    pub base_dtype: FloatDtype,
}

impl Default for AdapterOptions {
    fn default() -> Self {
        use clap::FromArgMatches;
        let cmd = <AdapterOptions as clap::Args>::augment_args(clap::Command::new("options"));
        let matches = cmd
            .try_get_matches_from(["options"])
            .expect("every option has a default");
        AdapterOptions::from_arg_matches(&matches).expect("the defaults are valid values")
    }
}

impl AdapterOptions {
    /// The adapters a run of a model of `num_layers` blocks trains, `None`
    /// for full fine-tuning.
    pub fn spec(&self, num_layers: usize) -> Option<AdapterSpec> {
        let kind = match self.fine_tune {
            FineTune::Full => return None,
            FineTune::Lora => AdapterKind::Lora,
            FineTune::Dora => AdapterKind::Dora,
        };
        let mut targets = self.lora_targets.0.clone();
        targets.sort();
        targets.dedup();
        Some(AdapterSpec {
            kind,
            rank: self.lora_rank,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            layers: AdapterSpec::last_layers(self.lora_layers, num_layers),
            targets,
        })
    }
}

impl AdapterOptions {
    /// The options that train `spec`'s adapters again on a model of
    /// `num_layers` blocks (`--init-from` a folder of adapters); an error
    /// when its blocks are not the last N, which the options cannot name.
    pub fn for_spec(
        &self,
        spec: &AdapterSpec,
        num_layers: usize,
    ) -> Result<AdapterOptions, String> {
        let n = spec.layers.len();
        if AdapterSpec::last_layers(n, num_layers) != spec.layers {
            return Err(format!(
                "the adapters are on blocks {:?} of {num_layers}: training continues only on the last N blocks (--lora-layers N)",
                spec.layers
            ));
        }
        Ok(AdapterOptions {
            fine_tune: match spec.kind {
                AdapterKind::Lora => FineTune::Lora,
                AdapterKind::Dora => FineTune::Dora,
            },
            lora_rank: spec.rank,
            lora_alpha: spec.alpha,
            lora_dropout: spec.dropout,
            lora_layers: n,
            lora_targets: Targets(spec.targets.clone()),
            base_dtype: self.base_dtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_has_no_spec_and_lora_adapts_the_last_blocks() {
        let mut o = AdapterOptions::default();
        assert_eq!(o.spec(4), None);
        o.fine_tune = FineTune::Dora;
        o.lora_layers = 2;
        o.lora_targets = "v,q,v_proj".parse().unwrap();
        let s = o.spec(4).unwrap();
        assert_eq!(s.kind, AdapterKind::Dora);
        assert_eq!(s.layers, vec![2, 3]);
        assert_eq!(s.targets, vec![Target::Q, Target::V]);
        assert_eq!(s.scale(), 2.0);
    }
}
