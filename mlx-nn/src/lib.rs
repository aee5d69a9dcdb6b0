//! Neural-network layers, the `Module` trait, losses and `average_gradients` (filled by a later issue).
