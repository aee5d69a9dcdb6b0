//! The Llama model and its data-parallel trainer (filled by a later issue).
