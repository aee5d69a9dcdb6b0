//! The weights as files name and lay them out, below both `import` (which
//! reads Hugging Face's and mlx-lm's folders) and `export` (which writes
//! them): the weights file's name, our tensor names against Hugging Face's
//! ([`names`]), and Hugging Face's `config.json` and its RoPE row order
//! ([`hf`]).

pub mod hf;
pub mod names;

/// The weights file of an export (and of a folder imported).
pub const WEIGHTS: &str = "model.safetensors";
