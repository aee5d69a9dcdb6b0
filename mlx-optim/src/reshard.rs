//! Optimizer state saved by one number of ranks, read back by another
//! (PyTorch's distributed checkpoints that load on a different world size).
//!
//! A whole state is one file; a [`Sharded`] state saved over `W` ranks is
//! `W` files, file `r` holding shard `r` of every slot (the parameter cut
//! flat into `ceil(N / W)` elements per rank, the last zero padded; the
//! rank and world in its metadata). [`read_whole_state`] puts either back
//! together whole, checked against the parameters;
//! [`Sharded::set_whole_state`] cuts this rank's shard of it for any world
//! size, and a whole optimizer takes it as it is:
//!
//! ```no_run
//! # fn main() -> mlx_optim::Result<()> {
//! # let (params, files): (mlx_array::Tree, Vec<std::path::PathBuf>) = todo!();
//! use mlx_optim::{AdamW, Optimizer, Sharded, read_whole_state};
//! let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();
//! let mut opt = Sharded::new(AdamW::new(1e-3), &world);
//! // `files`: the state files of a run at another world size, in rank order.
//! let whole = read_whole_state(&files, &params, opt.slot_names())?;
//! opt.set_whole_state(&whole)?;
//! # Ok(()) }
//! ```
//!
//! Moving state between world sizes copies values only, so training on
//! continues with the moments it would have had; the padding of a shard is
//! zero on save and again on load, as it is when training starts sharded.

use std::path::{Path, PathBuf};

use mlx_array::{Array, Tree, concatenate, reshape_to};

use crate::io::load_state_sharded;
use crate::sharded::{shard_of, shard_shapes};
use crate::state::OptimizerState;
use crate::{Error, Optimizer, Result, Sharded};

/// The whole optimizer state saved in `files`: one file holding a whole
/// state, or the `W` files of one state sharded over `W` ranks in rank
/// order. Every file is checked (its shard, its step, each slot's shape
/// against `params`, the slots `slots` of every parameter); the error names
/// the file and what is wrong.
pub fn read_whole_state(
    files: &[PathBuf],
    params: &Tree,
    slots: &[&str],
) -> Result<OptimizerState> {
    let w = files.len();
    match files {
        [] => Err(Error::Config(
            "no optimizer state files to read (expected one whole state or one file per rank)"
                .into(),
        )),
        [one] => load_state_sharded(one, params, slots, None),
        _ => {
            let shapes = shard_shapes(params, w)?;
            let shards = files
                .iter()
                .enumerate()
                .map(|(r, f)| {
                    load_state_sharded(f, &shapes, slots, Some((r, w))).map_err(|e| match e {
                        Error::Format { file, message } => Error::Format {
                            file,
                            message: format!(
                                "{message} (the {w} files given are read as the {w} shards of one state, in rank order)"
                            ),
                        },
                        e => e,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            join_shards(files, &shards, params)
        }
    }
}

/// The whole state of `shards` (one per rank, read from `files`).
fn join_shards(
    files: &[PathBuf],
    shards: &[OptimizerState],
    params: &Tree,
) -> Result<OptimizerState> {
    let first = &shards[0];
    for (f, s) in files.iter().zip(shards) {
        if s.step() != first.step() || s.is_empty() != first.is_empty() {
            return Err(disagree(f, &files[0], s, first));
        }
    }
    let mut whole = OptimizerState::new();
    whole.set_step(first.step());
    if first.is_empty() {
        return Ok(whole);
    }
    for (param, p) in params.flatten() {
        let slots = first
            .param(&param)
            .map(|m| m.keys().cloned().collect::<Vec<_>>());
        for slot in slots.into_iter().flatten() {
            let parts = shards
                .iter()
                .map(|s| s.get(&param, &slot).cloned())
                .collect::<Option<Vec<Array>>>()
                .ok_or_else(|| Error::MissingState {
                    file: files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    param: param.clone(),
                    slot: slot.clone(),
                })?;
            let flat = concatenate(&parts, 0)?.slice_axis(0, 0, p.size() as i64)?;
            whole.set(&param, &slot, reshape_to(&flat, p.shape())?);
        }
    }
    Ok(whole)
}

/// The error for two shard files of one state that disagree on the step.
fn disagree(f: &Path, first: &Path, s: &OptimizerState, s0: &OptimizerState) -> Error {
    let say = |s: &OptimizerState| match s.is_empty() {
        true => format!("step {} without moments", s.step()),
        false => format!("step {}", s.step()),
    };
    Error::Format {
        file: f.display().to_string(),
        message: format!(
            "holds {}, but {} holds {}: the files are not one saved state",
            say(s),
            first.display(),
            say(s0)
        ),
    }
}

impl<O: Optimizer> Sharded<O> {
    /// Takes `whole`, a whole state (from [`read_whole_state`]): this
    /// rank's shard of every slot (on a group of one, all of it). Evaluates
    /// the shards, so that the whole state can be dropped.
    pub fn set_whole_state(&mut self, whole: &OptimizerState) -> Result<()> {
        let (r, w) = (self.group().rank(), self.group().size());
        let mut state = OptimizerState::new();
        state.set_step(whole.step());
        for (name, a) in whole.flatten() {
            let (param, slot) = name
                .rsplit_once('.')
                .expect("flattened state names are `<parameter>.<slot>`");
            let shard = if w == 1 { a } else { shard_of(&a, r, w)? };
            state.set(param, slot, shard);
        }
        mlx_array::eval(state.flatten().iter().map(|(_, a)| a).collect::<Vec<_>>())?;
        *self.state_mut() = state;
        Ok(())
    }
}
