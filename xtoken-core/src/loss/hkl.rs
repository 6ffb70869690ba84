//! H-KL (paper §2.6): GOLD's hybrid loss with the common set relaxed by W. Every student row not
//! in the strict set adds `(s, argmax_t W[s,t])` when that entry is non-zero; strict pairs keep
//! priority, a teacher token claimed twice goes to the higher weight (ties: the lower student
//! id). W itself is frozen under H-KL.

use burn::tensor::Tensor;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::common::{CommonSet, CommonTables};
use crate::error::Result;
use crate::projection::SparseProjection;

/// The relaxed common set's tables for logits of the given widths.
pub fn tables(
    strict: &CommonSet,
    w: &SparseProjection,
    student_vocab: usize,
    teacher_vocab: usize,
) -> Result<CommonTables> {
    CommonTables::new(&CommonSet::relaxed(strict, w), student_vocab, teacher_vocab)
}

/// The H-KL loss `[1]` with the relaxed common set from [`tables`].
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    relaxed: &CommonTables,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::hkl(relaxed), params)
}
