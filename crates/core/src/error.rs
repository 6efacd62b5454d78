//! Core errors: corruption found while decoding or checking, and violated limits.

/// An error from the format layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// Data read from disk failed verification. `what` names the structure and its address.
    #[error("corruption in {what}: {detail}")]
    Corrupted { what: String, detail: String },
    /// A limit of the format was reached (metadata area full, name too long...).
    #[error("{0}")]
    Limit(String),
}

impl CoreError {
    /// Builds a corruption error.
    pub fn corrupted(what: impl Into<String>, detail: impl Into<String>) -> Self {
        CoreError::Corrupted {
            what: what.into(),
            detail: detail.into(),
        }
    }
}
