//! GOLD's hybrid loss (paper Eq. "gold_total"): per chunk
//! `λ_KL · Σ_{(s,t)∈C} p̂_T[t](log p̂_T[t] − log p̂_S[s]) + λ_ULD · ULD(p̂_S|_U_S, p̂_T|_U_T)`,
//! with C the strict 1-to-1 canonical common set ([`CommonSet::strict`]) and `U` the remainders.
//!
//! The student's softmax is over its full vocabulary, so the common term pushes every uncommon
//! logit down by `p_S[j] · Σ_{t∈C_T} p_T[t]` (the paper's Proposition 1): the suppressive
//! gradient that P-KL avoids.

use std::sync::Arc;

use burn::tensor::Tensor;
use xtoken_kernels::CommonPairs;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::common::CommonSet;
use crate::error::{Error, Result};

/// A common set as the partner tables the fused loss reads, for logits of given widths.
#[derive(Debug, Clone)]
pub struct CommonTables {
    pairs: Arc<CommonPairs>,
    pair_count: usize,
}

impl CommonTables {
    /// Tables for student logits `student_vocab` wide and teacher logits `teacher_vocab` wide
    /// (model vocabularies may be padded beyond their tokenizers).
    pub fn new(set: &CommonSet, student_vocab: usize, teacher_vocab: usize) -> Result<Self> {
        let pairs = CommonPairs::new(set.pairs(), student_vocab, teacher_vocab)?;
        Ok(Self {
            pairs: Arc::new(pairs),
            pair_count: set.len(),
        })
    }

    /// Number of pairs, |C|.
    pub fn len(&self) -> usize {
        self.pair_count
    }

    /// Whether C is empty.
    pub fn is_empty(&self) -> bool {
        self.pair_count == 0
    }

    pub(crate) fn pairs_for(&self, student: usize, teacher: usize) -> Result<Arc<CommonPairs>> {
        let found = (
            self.pairs.student_partner.len(),
            self.pairs.teacher_partner.len(),
        );
        if found != (student, teacher) {
            return Err(Error::Shape {
                what: "common set tables",
                expected: format!("student {student} × teacher {teacher} (the logits' widths)"),
                found: format!("student {} × teacher {}", found.0, found.1),
            });
        }
        Ok(self.pairs.clone())
    }
}

/// The GOLD loss `[1]` with the strict common set.
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    strict: &CommonTables,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::Gold(strict), params)
}
