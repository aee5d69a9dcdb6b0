//! Optimizers (SGD, Adam, AdamW), learning-rate schedules and gradient clipping (filled by a later issue).
