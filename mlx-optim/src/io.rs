//! Saving and loading optimizer state through safetensors.
//!
//! Layout (what `mx.save_safetensors(path, dict(tree_flatten(opt.state)))`
//! writes in MLX): `step` (a 0-d int64; MLX uses uint64), `learning_rate`
//! (a 0-d float32, informative: on load it is recomputed from the schedule
//! and the step), and one tensor `<parameter path>.<slot>` per slot. The step
//! is also written to the metadata, under `step`.

use std::collections::HashMap;
use std::path::Path;

use mlx_array::{Array, Dtype, Tree, load_safetensors, save_safetensors};

use crate::state::OptimizerState;
use crate::{Error, Result};

const STEP: &str = "step";
const LEARNING_RATE: &str = "learning_rate";

/// Metadata key naming the shard a file holds: `"<rank>/<world>"`.
const SHARD: &str = "shard";

pub(crate) fn save_state(path: &Path, state: &OptimizerState, learning_rate: f64) -> Result<()> {
    save_state_sharded(path, state, learning_rate, None)
}

/// [`save_state`] of shard `(rank, world)` of a sharded state (noted in the metadata).
pub(crate) fn save_state_sharded(
    path: &Path,
    state: &OptimizerState,
    learning_rate: f64,
    shard: Option<(usize, usize)>,
) -> Result<()> {
    if !state.pending().is_empty() {
        return Err(Error::Unsettled(
            "saving the optimizer state",
            state.pending().len(),
        ));
    }
    let step = i64::try_from(state.step())
        .map_err(|_| Error::Config(format!("step {} does not fit int64", state.step())))?;
    let mut arrays = vec![
        (STEP.to_string(), Array::scalar(step)),
        (
            LEARNING_RATE.to_string(),
            Array::scalar(learning_rate as f32),
        ),
    ];
    let slots = state.flatten();
    mlx_array::eval(slots.iter().map(|(_, a)| a).collect::<Vec<_>>())?;
    for (name, a) in slots {
        if name == STEP || name == LEARNING_RATE {
            return Err(Error::Config(format!(
                "a parameter's state is named `{name}`, which the state file reserves"
            )));
        }
        arrays.push((name, at_offset_zero(a)?));
    }
    let mut metadata = HashMap::from([
        // What MLX's `mx.save_safetensors` always writes.
        ("format".to_string(), "mlx".to_string()),
        (STEP.to_string(), state.step().to_string()),
    ]);
    if let Some((rank, world)) = shard {
        metadata.insert(SHARD.to_string(), format!("{rank}/{world}"));
    }
    save_safetensors(path, &arrays, Some(metadata))?;
    Ok(())
}

/// A copy of an evaluated float32 view that starts inside its buffer.
///
/// The fused Adam kernel hands out `m` and `v` as views at an element offset
/// into one buffer, and `mlx_array::save_safetensors` (as of this writing)
/// reads a view's bytes from `offset` bytes rather than `offset * 4`, so such
/// views are copied to buffers of their own before saving. Typed reads
/// (`to_vec`) handle offsets correctly.
fn at_offset_zero(a: Array) -> Result<Array> {
    if a.dtype() != Dtype::F32 || a.data()?.offset() == 0 {
        return Ok(a);
    }
    Ok(Array::from_slice(&a.to_vec::<f32>()?, a.shape())?)
}

fn describe(a_shape: &[usize], dtype: Dtype) -> String {
    format!("{dtype} {a_shape:?}")
}

pub(crate) fn load_state(path: &Path, params: &Tree, slots: &[&str]) -> Result<OptimizerState> {
    load_state_sharded(path, params, slots, None)
}

/// [`load_state`] of a file that must hold shard `(rank, world)` (or, with
/// `None`, a whole state); `params` has the shapes the slots must have.
pub(crate) fn load_state_sharded(
    path: &Path,
    params: &Tree,
    slots: &[&str],
    shard: Option<(usize, usize)>,
) -> Result<OptimizerState> {
    let file = path.display().to_string();
    let (mut arrays, metadata) = load_safetensors(path)?;
    let found = metadata.get(SHARD).cloned();
    let wanted = shard.map(|(r, w)| format!("{r}/{w}"));
    if found != wanted {
        let say = |s: &Option<String>| match s {
            Some(s) => format!("shard {s} (rank/world) of a sharded state"),
            None => "a whole (unsharded) state".to_string(),
        };
        return Err(Error::Format {
            file,
            message: format!(
                "holds {}, but this optimizer needs {}",
                say(&found),
                say(&wanted)
            ),
        });
    }
    let step_array = arrays.remove(STEP).ok_or_else(|| Error::Format {
        file: file.clone(),
        message: "no `step` tensor: not an optimizer state file".into(),
    })?;
    arrays.remove(LEARNING_RATE);
    if step_array.size() != 1 || step_array.dtype().is_float() {
        return Err(Error::Format {
            file,
            message: format!(
                "`step` should be one integer, found {}",
                describe(step_array.shape(), step_array.dtype())
            ),
        });
    }
    let step = step_array.item::<i64>()?;
    let step = u64::try_from(step).map_err(|_| Error::Format {
        file: file.clone(),
        message: format!("`step` is negative ({step})"),
    })?;

    let mut state = OptimizerState::new();
    state.set_step(step);
    for (name, a) in arrays {
        let unexpected = |detail: String| Error::UnexpectedState {
            file: file.clone(),
            name: name.clone(),
            detail,
        };
        let Some((param, slot)) = name.rsplit_once('.') else {
            return Err(unexpected(String::new()));
        };
        if !slots.contains(&slot) {
            return Err(unexpected(format!(
                " (this optimizer keeps the slots {slots:?} per parameter, not `{slot}`)"
            )));
        }
        let p = params
            .get_array(param)
            .ok_or_else(|| unexpected(format!(" (no parameter `{param}`)")))?;
        if p.shape() != a.shape() {
            return Err(Error::StateMismatch {
                file: file.clone(),
                name: name.clone(),
                expected: describe(p.shape(), p.dtype()),
                found: describe(a.shape(), a.dtype()),
            });
        }
        state.set(param, slot, a);
    }
    if !state.is_empty() {
        for (param, _) in params.flatten() {
            for slot in slots {
                if state.get(&param, slot).is_none() {
                    return Err(Error::MissingState {
                        file: file.clone(),
                        param: param.clone(),
                        slot: slot.to_string(),
                    });
                }
            }
        }
    }
    Ok(state)
}
