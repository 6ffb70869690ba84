//! Errors of the fused operations.

/// Why a fused operation refused its input.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KernelError {
    /// A row of logits holds NaN or +∞ (or only −∞), so its softmax is undefined.
    #[error("{side} logits: row {row} holds a non-finite value (NaN, +inf, or only -inf)")]
    NonFinite {
        /// `student` or `teacher`.
        side: &'static str,
        /// The flattened row.
        row: usize,
    },
    /// The loss came out non-finite although every logit row was finite (for example a
    /// teacher entry whose student probability is exactly 0 under plain KL).
    #[error("the {objective} loss is not finite ({value})")]
    NonFiniteLoss {
        /// Which loss.
        objective: &'static str,
        /// Its value.
        value: f64,
    },
    /// A tensor has the wrong shape.
    #[error("{what}: expected {expected}, found {found}")]
    Shape {
        /// Which tensor.
        what: &'static str,
        /// The shape wanted.
        expected: String,
        /// The shape given.
        found: String,
    },
    /// An index points outside its tensor.
    #[error("{what}: {field} {index} is out of range (size {size})")]
    IndexOutOfRange {
        /// Which input.
        what: &'static str,
        /// Which field of it.
        field: &'static str,
        /// The index.
        index: i64,
        /// The size it must stay below.
        size: usize,
    },
    /// An input that is well-shaped but not usable.
    #[error("{what}: {why}")]
    Invalid {
        /// Which input.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// The backend could not hand over a tensor's data.
    #[error("reading {what} from the device failed: {message}")]
    Read {
        /// Which tensor.
        what: &'static str,
        /// The backend's message.
        message: String,
    },
}
