//! GOLD, H-KL and ULD on a predicting row: the common KL over every pair of C whose teacher
//! token is a kept entry, plus the sorted L1 between the student's uncommon probabilities and
//! the teacher's entries outside C (zero-padded).

use std::sync::Arc;

use super::distill::{RowCtx, RowLoss, Scratch};
use crate::error::KernelError;
use crate::spec::{CommonPairs, DistillSpec};

/// The hybrid computation with its common set and weights.
pub(super) struct Hybrid {
    common: Arc<CommonPairs>,
    lambda_kl: f32,
    lambda_uld: f32,
}

impl Hybrid {
    /// The common set (checked against the logits' widths) and weights of `spec`'s loss.
    pub(super) fn new(
        spec: &DistillSpec,
        student_vocab: usize,
        teacher_vocab: usize,
    ) -> Result<Self, KernelError> {
        let (lambda_kl, lambda_uld) = spec.hybrid_lambdas();
        Ok(Self {
            common: spec.hybrid_pairs(student_vocab, teacher_vocab)?,
            lambda_kl,
            lambda_uld,
        })
    }
}

impl RowLoss for Hybrid {
    fn row(
        &self,
        ctx: &RowCtx<'_>,
        s: &mut Scratch,
        slot: usize,
        sigma: f64,
        z: &[f32],
        lse: f32,
    ) -> f64 {
        let (ids, logp) = ctx.teacher(slot);
        let (lambda_kl, lambda_uld) = (self.lambda_kl, self.lambda_uld);
        let common = &self.common;
        let mut loss = 0.0f64;
        let mut common_kl = 0.0f64;
        s.teacher_rest.clear();
        for (&t, &lq) in ids.iter().zip(logp) {
            let q = (lq as f64).exp();
            let partners = common.students_of(t as usize);
            if partners.is_empty() {
                s.teacher_rest.push(q as f32);
            } else if q > 0.0 {
                // One KL term per pair: a teacher entry shared by k student tokens counts k times.
                for &partner in partners {
                    let lps = (z[partner as usize] * ctx.tau_inv - lse) as f64 + sigma;
                    common_kl += q * (lq as f64 - lps);
                    s.h[partner as usize] -= lambda_kl * q as f32;
                }
            }
        }
        loss += lambda_kl as f64 * common_kl;
        if lambda_uld == 0.0 {
            return loss;
        }
        loss + lambda_uld as f64 * self.sorted_l1(s, sigma)
    }
}

impl Hybrid {
    /// `‖sort↓ p̂_S|_U − sort↓ q|_U‖₁` (zero-padded), adding `λ_ULD · sign · p̂` into `h`.
    fn sorted_l1(&self, s: &mut Scratch, sigma: f64) -> f64 {
        let es = sigma.exp() as f32;
        s.uncommon.clear();
        for (id, &p) in s.p.iter().enumerate() {
            if self.common.student_partner[id] < 0 {
                s.uncommon.push((es * p, id as u32));
            }
        }
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        s.teacher_rest.sort_unstable_by(|a, b| b.total_cmp(a));
        let (na, nb) = (s.uncommon.len(), s.teacher_rest.len());
        let m = na.min(nb);
        if m > 0 && m < na {
            s.uncommon.select_nth_unstable_by(m - 1, desc);
        }
        s.uncommon[..m].sort_unstable_by(desc);
        let mut uld = 0.0f64;
        for (i, &(a, id)) in s.uncommon.iter().enumerate() {
            let d = if i < m {
                let b = s.teacher_rest[i];
                uld += (a as f64 - b as f64).abs();
                if a > b {
                    1.0
                } else if a < b {
                    -1.0
                } else {
                    0.0
                }
            } else {
                uld += a as f64;
                1.0
            };
            s.h[id as usize] += self.lambda_uld * d * a;
        }
        uld + s.teacher_rest[m..].iter().map(|&b| b as f64).sum::<f64>()
    }
}
