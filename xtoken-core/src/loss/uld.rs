//! ULD, the universal logit distillation loss: per chunk `‖sort↓(p̂_S) − sort↓(p̂_T)‖₁`, the
//! shorter side zero-padded. Rank-based, so it needs no vocabulary correspondence (and pairs
//! tokens by rank alone, which is why the paper replaces it).
//!
//! The teacher side is its top-K entries (zeros beyond), so only the student's top-K values need
//! sorting: the rest of the student's mass is the L1 distance to the zero padding.

use burn::tensor::Tensor;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::error::Result;

/// The ULD loss `[1]` (weighted by `λ_ULD`).
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::uld(), params)
}
