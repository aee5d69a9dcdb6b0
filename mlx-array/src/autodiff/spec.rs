//! The conformance specifications of autodiff's own nodes: [`Tracer`],
//! the identity node that marks a differentiated input, and activation
//! checkpointing's [`Checkpointed`] and [`Depend`].

use std::sync::Arc;

use super::checkpoint::checkpointed;
use super::{
    Checkpointed, Depend, Recompute, Rematerialized, Tracer, checkpoint, depend, rematerialize,
};
use crate::conformance::*;
use crate::primitives::elementwise::spec::identity_values;
use crate::{Array, OutputSpec};

/// The specifications of autodiff's nodes.
pub fn specs() -> Vec<Spec> {
    vec![
        tracer(),
        rematerialized(),
        Spec::new::<Depend>(
            "depend",
            |cx: &Ctx| {
                identity_values(cx, "depend", |a| {
                    Ok(depend(
                        a,
                        &[crate::zeros_like(a), Array::ones(&[2], crate::Dtype::I32)],
                    ))
                })
            },
            || {
                GradCase::new(vec![uniform(5, &[2, 3], -2.0, 2.0)], &[0], |a| {
                    a[0].multiply(&depend(&a[0].sin()?, &[a[0].exp()?]))
                })
            },
        ),
        Spec::new::<Checkpointed>(
            "checkpoint",
            |cx: &Ctx| {
                // The node passes on the outputs it is given, bit for bit.
                identity_values(cx, "checkpoint", |a| {
                    let spec = OutputSpec {
                        shape: a.shape().to_vec(),
                        dtype: a.dtype(),
                    };
                    let f: Recompute = Arc::new(|x: &[Array]| Ok(vec![x[0].clone()]));
                    Ok(
                        checkpointed(f, vec![a.clone()], std::slice::from_ref(a), vec![spec])
                            .remove(0),
                    )
                })
            },
            || {
                // A block of two inputs and two outputs, recomputed for the
                // backward pass.
                GradCase::new(
                    vec![
                        uniform(6, &[2, 3], -2.0, 2.0),
                        uniform(7, &[3, 3], -1.0, 1.0),
                    ],
                    &[0, 1],
                    |a| {
                        let f: Recompute = Arc::new(|x: &[Array]| {
                            let h = x[0].matmul(&x[1])?.tanh()?;
                            Ok(vec![h.multiply(&x[0])?, h.exp()?])
                        });
                        let outs = checkpoint(f, a)?;
                        outs[0].add(&outs[1].sin()?)
                    },
                )
            },
        ),
    ]
}

/// A rematerialized value passes on the value it is given; its readers'
/// gradients read it recomputed, and its own reaches its inputs.
fn rematerialized() -> Spec {
    Spec::new::<Rematerialized>(
        "rematerialize",
        |cx: &Ctx| {
            identity_values(cx, "rematerialize", |a| {
                let f: Recompute = Arc::new(|x: &[Array]| Ok(vec![x[0].clone()]));
                let node = Array::from_primitive(
                    super::rematerialize::for_spec(f),
                    vec![a.clone(), a.clone()],
                    a.shape().to_vec(),
                    a.dtype(),
                );
                Ok(node)
            })
        },
        || {
            GradCase::new(
                vec![
                    uniform(8, &[2, 3], -2.0, 2.0),
                    uniform(9, &[3, 3], -1.0, 1.0),
                ],
                &[0, 1],
                |a| {
                    let f: Recompute = Arc::new(|p: &[Array]| Ok(vec![p[0].sin()?.exp()?]));
                    let w = rematerialize(f, &a[1..])?;
                    a[0].matmul(&w)?.multiply(&w.sum(&[0], true)?)
                },
            )
        },
    )
}

fn tracer() -> Spec {
    Spec::new::<Tracer>(
        "tracer",
        |cx: &Ctx| {
            identity_values(cx, "tracer", |a| {
                Ok(Array::from_primitive(
                    Tracer,
                    vec![a.clone()],
                    a.shape().to_vec(),
                    a.dtype(),
                ))
            })
        },
        || {
            GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
                Ok(a[0].clone())
            })
        },
    )
}
