//! Layers, one family per file.

pub mod activations;
pub mod attention;
pub mod dropout;
pub mod embedding;
pub mod linear;
pub mod lora;
pub mod mlp;
pub mod norm;
pub mod rope;
pub mod sequential;
pub mod sharded;
