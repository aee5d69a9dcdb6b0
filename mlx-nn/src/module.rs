//! The `Module` trait: named parameters, nested modules, freezing, and
//! safetensors weights.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mlx_array::{Array, Error, Result, Tree};

/// One trainable array of a module, with its frozen flag.
#[derive(Clone, Debug)]
pub struct Param {
    value: Array,
    frozen: bool,
}

impl Param {
    /// A trainable parameter.
    pub fn new(value: Array) -> Param {
        Param {
            value,
            frozen: false,
        }
    }
    /// The current value.
    pub fn value(&self) -> &Array {
        &self.value
    }
    /// Replaces the value.
    pub fn set(&mut self, value: Array) {
        self.value = value;
    }
    /// True when excluded from `trainable_parameters`.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }
    /// Sets the frozen flag.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }
}

/// Joins a dotted prefix and a name.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A model or layer: anything with named parameters.
///
/// Implementors only list their parameters and children (usually with
/// [`impl_module!`](crate::impl_module)); everything else comes from
/// [`ModuleExt`]. Names are MLX's dotted paths: `layers.0.attention.query_proj.weight`.
pub trait Module {
    /// Calls `f` with the full dotted name of every parameter.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param));
    /// Calls `f` with the full dotted name of every parameter, mutably.
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param));
}

impl<M: Module> Module for Vec<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (i, m) in self.iter().enumerate() {
            m.visit(&join(prefix, &i.to_string()), f);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_mut(&join(prefix, &i.to_string()), f);
        }
    }
}

impl<M: Module> Module for Option<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        if let Some(m) = self {
            m.visit(prefix, f)
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        if let Some(m) = self {
            m.visit_mut(prefix, f)
        }
    }
}

impl Module for Param {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(prefix, self)
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        f(prefix, self)
    }
}

/// Implements [`Module`] for a struct from the names of its fields: each
/// field is a [`Param`], an `Option<Param>`, a module, or a `Vec` of modules.
///
/// ```
/// use mlx_nn::{impl_module, Linear, Param};
/// struct Head { proj: Linear, scale: Param }
/// impl_module!(Head { proj, scale });
/// ```
#[macro_export]
macro_rules! impl_module {
    ($t:ty { $($field:ident),* $(,)? }) => {
        impl $crate::Module for $t {
            fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &$crate::Param)) {
                let _ = (prefix, &f);
                $( $crate::Module::visit(&self.$field, &$crate::module::join(prefix, stringify!($field)), f); )*
            }
            fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut $crate::Param)) {
                let _ = (prefix, &f);
                $( $crate::Module::visit_mut(&mut self.$field, &$crate::module::join(prefix, stringify!($field)), f); )*
            }
        }
    };
}

/// What every [`Module`] can do, given its parameters.
pub trait ModuleExt: Module {
    /// Every parameter as a tree (MLX's `model.parameters()`).
    fn parameters(&self) -> Tree {
        collect(self, |_| true)
    }

    /// The parameters that are not frozen.
    fn trainable_parameters(&self) -> Tree {
        collect(self, |p| !p.is_frozen())
    }

    /// Every parameter with its dotted name, in order.
    fn named_parameters(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        self.visit("", &mut |n, p| out.push((n.to_string(), p.value().clone())));
        out
    }

    /// Total number of parameter elements.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit("", &mut |_, p| n += p.value().size());
        n
    }

    /// Sets parameters from a tree that may hold a subset of them (as after
    /// an optimizer step on the trainable ones). A name the model does not
    /// have, or a different shape, is an error naming the tensor; on error
    /// nothing is changed.
    fn update(&mut self, params: &Tree) -> Result<()> {
        let mut new: BTreeMap<String, Array> = params.flatten().into_iter().collect();
        let mut err = None;
        self.visit("", &mut |name, p| {
            if let Some(a) = new.get(name)
                && a.shape() != p.value().shape()
                && err.is_none()
            {
                err = Some(Error::Shape {
                    op: "update",
                    message: format!(
                        "parameter `{name}` has shape {:?}, the new value {:?}",
                        p.value().shape(),
                        a.shape()
                    ),
                });
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let known: BTreeSet<String> = self
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if let Some(unknown) = new.keys().find(|k| !known.contains(*k)) {
            return Err(Error::Invalid {
                op: "update",
                message: format!("the model has no parameter `{unknown}`"),
            });
        }
        self.visit_mut("", &mut |name, p| {
            if let Some(a) = new.remove(name) {
                p.set(a);
            }
        });
        Ok(())
    }

    /// Freezes every parameter (excluded from gradients and updates).
    fn freeze(&mut self) {
        self.visit_mut("", &mut |_, p| p.set_frozen(true));
    }

    /// Unfreezes every parameter.
    fn unfreeze(&mut self) {
        self.visit_mut("", &mut |_, p| p.set_frozen(false));
    }

    /// Freezes (or unfreezes) the parameters whose name is or starts with
    /// one of `prefixes` followed by a dot; returns how many changed.
    fn set_frozen_where(&mut self, prefixes: &[&str], frozen: bool) -> usize {
        let mut n = 0;
        self.visit_mut("", &mut |name, p| {
            if prefixes
                .iter()
                .any(|q| name == *q || name.starts_with(&format!("{q}.")))
            {
                p.set_frozen(frozen);
                n += 1;
            }
        });
        n
    }

    /// Writes every parameter to a safetensors file (MLX's `save_weights`),
    /// its `__metadata__` `{"format": "mlx"}` as MLX writes it.
    fn save_weights(&self, path: impl AsRef<Path>) -> Result<()> {
        let metadata = [("format".to_string(), "mlx".to_string())].into();
        mlx_array::save_safetensors(path, &self.named_parameters(), Some(metadata))
    }

    /// Reads weights saved by [`ModuleExt::save_weights`] (or MLX). Every
    /// parameter must be present with its shape and no extra tensor may
    /// appear; the error names the tensor. On error nothing is changed.
    fn load_weights(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (loaded, _) = mlx_array::load_safetensors(path)?;
        let fmt = |message: String| Error::Format {
            path: path.display().to_string(),
            message,
        };
        let mine = self.named_parameters();
        for (name, a) in &mine {
            match loaded.get(name) {
                None => {
                    return Err(fmt(format!(
                        "missing tensor `{name}` (shape {:?})",
                        a.shape()
                    )));
                }
                Some(b) if b.shape() != a.shape() => {
                    return Err(fmt(format!(
                        "tensor `{name}` has shape {:?}, the model expects {:?}",
                        b.shape(),
                        a.shape()
                    )));
                }
                Some(b) if b.dtype() != a.dtype() => {
                    return Err(fmt(format!(
                        "tensor `{name}` has dtype {}, the model expects {}",
                        b.dtype(),
                        a.dtype()
                    )));
                }
                _ => {}
            }
        }
        if let Some(extra) = loaded.keys().find(|k| !mine.iter().any(|(n, _)| n == *k)) {
            return Err(fmt(format!(
                "unexpected tensor `{extra}`: the model has no such parameter"
            )));
        }
        self.update(&Tree::unflatten(loaded)?)
    }
}

impl<M: Module + ?Sized> ModuleExt for M {}

fn collect<M: Module + ?Sized>(m: &M, keep: impl Fn(&Param) -> bool) -> Tree {
    let mut items = Vec::new();
    m.visit("", &mut |n, p| {
        if keep(p) {
            items.push((n.to_string(), p.value().clone()));
        }
    });
    Tree::unflatten(items).expect("parameter names are unique dotted paths")
}
