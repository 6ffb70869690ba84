//! P-KL (paper §2.5): the student's merged distribution is projected into the teacher's
//! vocabulary through W and re-normalized over it (the paper's appendix on W),
//! `p̃_S = Wᵀp̂_S · Σ_s p̂_S[s] / Σ_s r_s p̂_S[s]` with `r_s` W's row sums, and compared with
//! `KL(p̂_T ‖ p̃_S)` on the teacher's top-K. The re-normalization gives back the mass that W's
//! empty rows (student tokens no rule maps) would drop, so `p̃_S` carries the student chunk's own
//! mass (1 for a single-token chunk, the continuation probability for a merged one). Every
//! student token, common or not, gets teacher-aware supervision.
//!
//! W is a [`LearnableProjection`]: its sparsity pattern (the top-4 teacher ids per student row)
//! is fixed, its values are a softmax over each row's slots, so they stay non-negative and rows
//! stay stochastic whatever an optimizer does. The paper trains it with its own AdamW at lr 1e-2
//! and no gradient clipping, beside the student.

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use std::sync::Arc;

use xtoken_kernels::layout::ProjectionLayout;
use xtoken_kernels::ProjectionTensors;

use super::{evaluate, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::error::{Error, Result};
use crate::projection::SparseProjection;

/// Logit given to empty slots before the row softmax; their weight is then masked to 0.
const EMPTY_SLOT: f32 = -1.0e4;

/// W `[V_S, K]` as a burn module: fixed teacher ids, trainable slot logits.
#[derive(Module, Debug)]
pub struct LearnableProjection<B: Backend> {
    /// Per slot, the logit whose row softmax is the weight.
    pub slot_logits: Param<Tensor<B, 2>>,
    /// Teacher ids `[V_S, K]`, `-1` for an empty slot.
    indices: Tensor<B, 2, Int>,
    /// True on empty slots.
    empty: Tensor<B, 2, Bool>,
    /// 1 on occupied slots, 0 on empty ones.
    occupied: Tensor<B, 2>,
    teacher_vocab: usize,
    /// The ids checked and sorted once, so that no evaluation reads them back.
    #[module(skip)]
    layout: Arc<ProjectionLayout>,
}

impl<B: Backend> LearnableProjection<B> {
    /// Starts from a built W (whose rows already sum to 1, so the softmax reproduces it), padded
    /// with empty rows to `student_vocab` rows when the student's logits are wider than its
    /// tokenizer.
    pub fn new(w: &SparseProjection, student_vocab: usize, device: &B::Device) -> Result<Self> {
        let rows = w.student_vocab_size();
        if student_vocab < rows {
            return Err(Error::Shape {
                what: "learnable projection",
                expected: format!("at least the {rows} rows of W"),
                found: format!("{student_vocab} student logits"),
            });
        }
        if w.indices().iter().all(|&i| i < 0) {
            return Err(Error::BadParameter {
                name: "projection",
                value: format!("{rows} empty rows"),
                why: "W has no entry: P-KL would project nothing into the teacher vocabulary",
            });
        }
        let k = w.top_k();
        let mut indices: Vec<i64> = w.indices().iter().map(|&i| i as i64).collect();
        indices.resize(student_vocab * k, -1);
        let mut logits: Vec<f32> = w
            .indices()
            .iter()
            .zip(w.weights())
            .map(|(&i, &x)| {
                if i >= 0 {
                    x.max(1e-30).ln()
                } else {
                    EMPTY_SLOT
                }
            })
            .collect();
        logits.resize(student_vocab * k, EMPTY_SLOT);
        let occupied: Vec<f32> = indices.iter().map(|&i| (i >= 0) as u8 as f32).collect();
        let empty: Vec<bool> = indices.iter().map(|&i| i < 0).collect();
        let shape = [student_vocab, k];
        let layout = ProjectionLayout::new(indices.clone(), shape, w.teacher_vocab_size())?;
        Ok(Self {
            slot_logits: Param::from_tensor(Tensor::from_data(
                TensorData::new(logits, shape),
                device,
            )),
            indices: Tensor::from_data(TensorData::new(indices, shape), device),
            empty: Tensor::from_data(TensorData::new(empty, shape), device),
            occupied: Tensor::from_data(TensorData::new(occupied, shape), device),
            teacher_vocab: w.teacher_vocab_size(),
            layout,
        })
    }

    /// The weights `[V_S, K]`: non-negative, each row summing to 1 (0 for a row with no slot).
    pub fn weights(&self) -> Tensor<B, 2> {
        let masked = self
            .slot_logits
            .val()
            .mask_fill(self.empty.clone(), EMPTY_SLOT);
        softmax(masked, 1) * self.occupied.clone()
    }

    /// The teacher ids `[V_S, K]` (`-1`: empty slot).
    pub fn indices(&self) -> Tensor<B, 2, Int> {
        self.indices.clone()
    }

    /// Rows (the student vocabulary it serves).
    pub fn student_vocab(&self) -> usize {
        self.indices.dims()[0]
    }

    /// The teacher vocabulary its ids point into.
    pub fn teacher_vocab(&self) -> usize {
        self.teacher_vocab
    }

    pub(crate) fn tensors(
        &self,
        student_vocab: usize,
        teacher_vocab: usize,
    ) -> Result<ProjectionTensors<B>> {
        if self.student_vocab() != student_vocab || self.teacher_vocab > teacher_vocab {
            return Err(Error::Shape {
                what: "learnable projection",
                expected: format!(
                    "{student_vocab} rows into at most {teacher_vocab} teacher ids (the logits' widths)"
                ),
                found: format!(
                    "{} rows into {} teacher ids",
                    self.student_vocab(),
                    self.teacher_vocab
                ),
            });
        }
        Ok(ProjectionTensors {
            indices: self.indices.clone().into_primitive(),
            weights: self.weights().into_primitive().tensor(),
            layout: Some(self.layout.clone()),
        })
    }
}

/// The P-KL loss `[1]`; under `Autodiff` its gradient reaches both the student logits and
/// `w.slot_logits` (unless `w` is frozen with `no_grad`).
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    w: &LearnableProjection<B>,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    evaluate(student_logits, targets, Loss::pkl(w), params)
}
