//! `Sequential`: layers applied one after another.

use mlx_array::{Array, Result};

use crate::{Module, Param};

/// A module with a single-input forward pass, so it can sit in a [`Sequential`].
pub trait Layer: Module {
    /// Applies the layer.
    fn forward(&self, x: &Array) -> Result<Array>;
}

impl Layer for crate::Linear {
    fn forward(&self, x: &Array) -> Result<Array> {
        crate::Linear::forward(self, x)
    }
}

impl Layer for crate::RMSNorm {
    fn forward(&self, x: &Array) -> Result<Array> {
        crate::RMSNorm::forward(self, x)
    }
}

impl Layer for crate::LayerNorm {
    fn forward(&self, x: &Array) -> Result<Array> {
        crate::LayerNorm::forward(self, x)
    }
}

impl Layer for crate::SwiGLU {
    fn forward(&self, x: &Array) -> Result<Array> {
        crate::SwiGLU::forward(self, x)
    }
}

/// Layers applied in order; parameters are named `layers.N....` as in MLX.
#[derive(Default)]
pub struct Sequential {
    /// The layers, first applied first.
    pub layers: Vec<Box<dyn Layer>>,
}

impl Module for Box<dyn Layer> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        (**self).visit(prefix, f)
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        (**self).visit_mut(prefix, f)
    }
}

crate::impl_module!(Sequential { layers });

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential::default()
    }
    /// Appends a layer (builder style).
    pub fn push(mut self, layer: impl Layer + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Array) -> Result<Array> {
        self.layers.iter().try_fold(x.clone(), |h, l| l.forward(&h))
    }
}
