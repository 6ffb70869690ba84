//! GOLD's hybrid loss (paper Eq. "gold_total"): per chunk
//! `λ_KL · Σ_{(s,t)∈C} p̂_T[t](log p̂_T[t] − log p̂_S[s]) + λ_ULD · ULD(p̂_S|_U_S, p̂_T|_U_T)`,
//! with C the strict 1-to-1 canonical common set ([`crate::common::CommonSet::strict`]) and `U` the remainders.
//!
//! The student's softmax is over its full vocabulary, so the common term pushes every uncommon
//! logit down by `p_S[j] · Σ_{t∈C_T} p_T[t]` (the paper's Proposition 1): the suppressive
//! gradient that P-KL avoids.

use burn::tensor::Tensor;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::common::CommonTables;
use crate::error::Result;

/// The GOLD loss `[1]` with the strict common set's tables ([`CommonTables::new`] of
/// [`crate::common::CommonSet::strict`]).
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    strict: &CommonTables,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::gold(strict), params)
}
