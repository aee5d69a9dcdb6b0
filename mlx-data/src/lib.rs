//! Data sources, tokenizers, the memory-mapped token store and the sharded distributed loader (filled by a later issue).
