//! The conformance specification of [`Tracer`], the identity node that
//! marks a differentiated input.

use super::Tracer;
use crate::Array;
use crate::conformance::*;
use crate::primitives::elementwise::spec::identity_values;

/// The tracer's specification.
pub fn specs() -> Vec<Spec> {
    vec![Spec::new::<Tracer>(
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
    )]
}
