//! Multi-teacher distillation (paper §2.7): `L_KD = Σ_m α_m L_m`, each teacher with its own loss
//! and targets. α is static, or adaptive: a softmax over teachers of a batch-mean confidence
//! (`−CE`, `−entropy` or max-probability, paper appendix "Confidence-adaptive weight schedules").
//! The paper finds static weights best.

use burn::tensor::{Tensor, TensorData};

use super::{evaluate, ConfidenceStats, Loss, LossParams, TeacherTargets, XTokenBackend};
use crate::error::{Error, Result};

/// Which confidence measure drives adaptive α.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfidenceMeasure {
    /// Mean `log p_T[y]` of the observed next token (`−CE`).
    NegCrossEntropy,
    /// Mean `Σ p_T log p_T` (`−H`).
    NegEntropy,
    /// Mean `max p_T`.
    MaxProb,
}

impl ConfidenceMeasure {
    /// This measure of a teacher's statistics.
    pub fn of(self, stats: &ConfidenceStats) -> f64 {
        match self {
            ConfidenceMeasure::NegCrossEntropy => stats.neg_cross_entropy,
            ConfidenceMeasure::NegEntropy => stats.neg_entropy,
            ConfidenceMeasure::MaxProb => stats.max_prob,
        }
    }
}

/// How the teachers are weighted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weighting {
    /// Each teacher's own `alpha`.
    Static,
    /// `α = softmax_m(confidence_m)`; needs targets built with
    /// [`TeacherTargets::with_confidence`].
    Adaptive(ConfidenceMeasure),
}

/// One teacher's term.
#[derive(Debug)]
pub struct Teacher<'a, B: XTokenBackend> {
    /// Its targets for this batch.
    pub targets: &'a TeacherTargets<B>,
    /// Its loss.
    pub loss: Loss<'a, B>,
    /// Its static weight.
    pub alpha: f64,
}

/// The combined loss and what went into it.
#[derive(Debug, Clone)]
pub struct MultiTeacherLoss<B: XTokenBackend> {
    /// `Σ_m α_m L_m` `[1]`.
    pub total: Tensor<B, 1>,
    /// Each `L_m` `[1]`, in the teachers' order.
    pub per_teacher: Vec<Tensor<B, 1>>,
    /// The α used.
    pub alphas: Vec<f64>,
}

/// The weights α of `teachers` under `weighting`.
pub fn alphas<B: XTokenBackend>(
    teachers: &[Teacher<'_, B>],
    weighting: Weighting,
) -> Result<Vec<f64>> {
    match weighting {
        Weighting::Static => {
            if let Some((m, t)) = teachers
                .iter()
                .enumerate()
                .find(|(_, t)| !(t.alpha.is_finite() && t.alpha >= 0.0))
            {
                return Err(Error::BadParameter {
                    name: "alpha",
                    value: format!("{} (teacher {m})", t.alpha),
                    why: "static weights must be non-negative finite numbers",
                });
            }
            Ok(teachers.iter().map(|t| t.alpha).collect())
        }
        Weighting::Adaptive(kind) => {
            let scores = teachers
                .iter()
                .enumerate()
                .map(|(m, t)| {
                    let c = t.targets.confidence().ok_or(Error::BadParameter {
                        name: "weighting",
                        value: format!("adaptive (teacher {m})"),
                        why: "adaptive α needs targets built with TeacherTargets::with_confidence",
                    })?;
                    Ok(kind.of(&c))
                })
                .collect::<Result<Vec<f64>>>()?;
            Ok(softmax(&scores))
        }
    }
}

/// Adaptive α from each teacher's confidence score: `softmax_m(score_m)`.
pub fn softmax(scores: &[f64]) -> Vec<f64> {
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// Evaluates every teacher's loss on the same student logits `[B, T_S, V_S]` and sums them with
/// their weights.
pub fn loss<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    teachers: &[Teacher<'_, B>],
    weighting: Weighting,
    params: &LossParams,
) -> Result<MultiTeacherLoss<B>> {
    if teachers.is_empty() {
        return Err(Error::BadParameter {
            name: "teachers",
            value: "[]".into(),
            why: "multi-teacher distillation needs at least one teacher",
        });
    }
    let alphas = alphas(teachers, weighting)?;
    with_alphas(student_logits, teachers, alphas, params)
}

/// As [`loss`] with the weights given: α fixed beforehand, e.g. once for a training step of
/// several micro-batches (each teacher's `alpha` field is not read).
pub fn with_alphas<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    teachers: &[Teacher<'_, B>],
    alphas: Vec<f64>,
    params: &LossParams,
) -> Result<MultiTeacherLoss<B>> {
    let per_teacher = teachers
        .iter()
        .map(|t| evaluate(student_logits.clone(), t.targets, t.loss, params))
        .collect::<Result<Vec<_>>>()?;
    combine(per_teacher, alphas, &student_logits.device())
}

/// `alphas` holds one finite weight for each of `teachers`: what [`combine`] requires, for a
/// caller that weights the losses itself.
pub fn check_alphas(alphas: &[f64], teachers: usize) -> Result<()> {
    if alphas.len() != teachers || alphas.iter().any(|a| !a.is_finite()) {
        return Err(Error::BadParameter {
            name: "alphas",
            value: format!("{alphas:?}"),
            why: "needs one finite weight per teacher",
        });
    }
    Ok(())
}

/// The weighted sum of losses evaluated one teacher at a time (`per_teacher[m]`, a `[1]`
/// tensor each, on `device`): what [`with_alphas`] returns, for a caller that evaluates each
/// loss itself.
pub fn combine<B: XTokenBackend>(
    per_teacher: Vec<Tensor<B, 1>>,
    alphas: Vec<f64>,
    device: &B::Device,
) -> Result<MultiTeacherLoss<B>> {
    check_alphas(&alphas, per_teacher.len())?;
    let mut total = Tensor::<B, 1>::from_data(TensorData::new(vec![0.0f32], [1]), device);
    for (l, &a) in per_teacher.iter().zip(&alphas) {
        total = total + l.clone() * a;
    }
    Ok(MultiTeacherLoss {
        total,
        per_teacher,
        alphas,
    })
}
