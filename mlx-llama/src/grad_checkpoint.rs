//! Activation checkpointing of a Llama's blocks (mlx-lm's
//! `--grad-checkpoint`, torchtitan's per-layer policy): which blocks
//! recompute their activations in the backward pass instead of keeping
//! them, and a block's forward so recomputed.
//!
//! ```
//! use mlx_llama::grad_checkpoint::GradCheckpoint;
//! let every_second: GradCheckpoint = "2".parse().unwrap();
//! assert_eq!((0..6).filter(|&b| every_second.applies(b)).collect::<Vec<_>>(), [1, 3, 5]);
//! assert!("all".parse::<GradCheckpoint>().unwrap().applies(0));
//! assert!(!GradCheckpoint::default().applies(0));
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use mlx_array::autodiff::{Recompute, checkpoint};
use mlx_array::{Array, Result};
use mlx_nn::{AttentionMask, Module};

use crate::model::LlamaEncoderLayer;

/// Which blocks are checkpointed: none (the default), every block, or
/// every `k`-th (blocks `k - 1`, `2k - 1`, ..., as torchtitan counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GradCheckpoint {
    /// 0: none; 1: every block; k: every k-th.
    every: usize,
}

impl GradCheckpoint {
    /// Every block.
    pub const ALL: GradCheckpoint = GradCheckpoint { every: 1 };

    /// Every `k`-th block (`k` = 0: none).
    pub fn every(k: usize) -> GradCheckpoint {
        GradCheckpoint { every: k }
    }

    /// Whether block `index` (from 0) is checkpointed.
    pub fn applies(&self, index: usize) -> bool {
        self.every > 0 && (index + 1).is_multiple_of(self.every)
    }

    /// Whether any block is.
    pub fn is_on(&self) -> bool {
        self.every > 0
    }
}

impl FromStr for GradCheckpoint {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "none" | "0" => Ok(GradCheckpoint::every(0)),
            "all" => Ok(GradCheckpoint::ALL),
            k => match k.parse::<usize>() {
                Ok(k) => Ok(GradCheckpoint::every(k)),
                Err(_) => Err(format!(
                    "`{s}` is not a checkpointing policy: all (every block), a number k (every k-th block) or none"
                )),
            },
        }
    }
}

impl fmt::Display for GradCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.every {
            0 => f.write_str("none"),
            1 => f.write_str("all"),
            k => write!(f, "{k}"),
        }
    }
}

impl TryFrom<String> for GradCheckpoint {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<GradCheckpoint> for String {
    fn from(g: GradCheckpoint) -> String {
        g.to_string()
    }
}

/// The attention mask a recomputation keeps (the mask's array, if any,
/// held by the recomputation and given no gradient).
#[derive(Clone)]
enum KeptMask {
    None,
    Causal,
    Additive(Array),
}

impl KeptMask {
    fn new(mask: AttentionMask<'_>) -> KeptMask {
        match mask {
            AttentionMask::None => KeptMask::None,
            AttentionMask::Causal => KeptMask::Causal,
            AttentionMask::Additive(m) => KeptMask::Additive(m.clone()),
        }
    }

    fn mask(&self) -> AttentionMask<'_> {
        match self {
            KeptMask::None => AttentionMask::None,
            KeptMask::Causal => AttentionMask::Causal,
            KeptMask::Additive(m) => AttentionMask::Additive(m),
        }
    }
}

/// `layer`'s forward of the residual stream `x`, its activations
/// recomputed in the backward pass ([`mlx_array::autodiff::checkpoint`]):
/// the checkpointed function's inputs are `x` and the block's trainable
/// parameters, so they get gradients; frozen ones (an adapter run's base)
/// are held by the recomputation and get none, as they should.
pub fn checkpointed_forward(
    layer: &LlamaEncoderLayer,
    x: &Array,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    let mut inputs = vec![x.clone()];
    layer.visit("", &mut |_, p| {
        if !p.is_frozen() {
            inputs.push(p.value().clone());
        }
    });
    let (layer, mask) = (layer.clone(), KeptMask::new(mask));
    let f: Recompute = Arc::new(move |xs: &[Array]| {
        let mut block = layer.clone();
        let mut trainable = xs[1..].iter();
        block.visit_mut("", &mut |_, p| {
            if !p.is_frozen()
                && let Some(v) = trainable.next()
            {
                p.set(v.clone());
            }
        });
        Ok(vec![block.forward(&xs[0], mask.mask(), None)?])
    });
    Ok(checkpoint(f, &inputs)?.remove(0))
}
