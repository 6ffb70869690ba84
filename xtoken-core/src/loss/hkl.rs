//! H-KL (paper §2.6): GOLD's hybrid loss with the common set relaxed by W
//! ([`CommonSet::relaxed`]): every student token outside the strict set is paired with its
//! top-1 teacher token under W when that entry is non-zero, so several student tokens may share
//! a teacher token and its entry then appears in one KL term per pair. W itself is frozen under
//! H-KL.

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
