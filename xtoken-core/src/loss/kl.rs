//! KL for a same-tokenizer teacher (paper §2.3): per chunk
//! `KL(p̂_T ‖ p̂_S) = Σ_{t ∈ top-K} p̂_T[t] (log p̂_T[t] − log p̂_S[t])`.
//!
//! The teacher's ids index the student's vocabulary directly, so its logits may be no wider than
//! the student's.

use burn::tensor::Tensor;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::error::Result;

/// The KL loss `[1]` of student logits `[B, T, V_S]` against a same-tokenizer teacher.
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::kl(), params)
}
