//! Which split of a dataset: training or validation. A leaf that every
//! source (the offline corpus among them) names.

/// Training or validation data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Split {
    /// The training split.
    Train,
    /// The validation split.
    Validation,
}

impl Split {
    /// `train` or `validation`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
        }
    }
}
